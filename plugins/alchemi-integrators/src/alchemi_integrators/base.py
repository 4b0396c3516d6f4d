"""What every integrator of this package shares: parameters, state fields, backends, scratch space.

An integrator here is a :class:`~alchemi_core.dynamics.BaseDynamics` whose physical parameters are
:class:`~alchemi_integrators.parameters.SystemParameter` objects (a scalar, one value per system,
or a field name), whose per-system state lives in batch fields created in ``setup`` and reset for
entering systems in ``init_state``, and whose step runs on one of two backends:

* ``"torch"``: a few fused torch operations per update (``addcmul_``, ``index_add_``), with
  coefficients cached between steps while the batch's composition and the stage's masks stay the
  same. Runs anywhere.
* ``"warp"``: fused Warp kernels launched on torch's current stream, zero-copy on the batch's
  tensors. Needs ``warp-lang``.

``backend="auto"`` (the default) picks Warp on CUDA devices when ``warp-lang`` is installed. On a
CPU it picks what measured faster there (:attr:`Integrator.cpu_backend`): torch for velocity
Verlet (a few vectorised operations); Warp for Langevin (one kernel per half-step, its Gaussian
draws inside it, the same kernels as on a GPU), and for Nose-Hoover chains, FIRE and both NPT
integrators, whose per-system bookkeeping is one Warp kernel instead of tens of tiny torch
operations (about 3x and 8x faster for 64 argon cells of 108 atoms on one core; MTK 3.3x for 12
cells of 256 atoms on two, C-rescale 2x for 4 cells of 256).

Example:
    >>> from alchemi_core import registry
    >>> vv = registry.build("integrator:velocity-verlet", model=model, dt=2.0, n_steps=100)  # doctest: +SKIP
    >>> vv.parameters["dt"]  # doctest: +SKIP
    dt=2
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from alchemi_core.dynamics import BaseDynamics
from alchemi_core.errors import ConfigurationError, MissingDependencyError
from alchemi_core.workspace import Workspace
from alchemi_integrators.parameters import ParameterValue, SystemParameter

if TYPE_CHECKING:
    from alchemi_core.data import Batch

BACKENDS = ("auto", "torch", "warp")

__all__ = ["BACKENDS", "Integrator", "MDIntegrator", "Workspace", "warp_available"]


def warp_available() -> bool:
    """Whether ``warp-lang`` can be imported."""
    import importlib.util

    return importlib.util.find_spec("warp") is not None


class Integrator(BaseDynamics):
    """Base class of this package's integrators (see the module docstring).

    Args:
        model: Returns ``energy`` ``[B, 1]`` and ``forces`` ``[V, 3]`` for a batch.
        n_steps: Steps of ``run()`` (each system's budget inside fused stages and pipelines).
        dt: Time step in fs: a number, ``[B]`` tensor, or the name of a system-level field.
        backend: ``"auto"``, ``"torch"`` or ``"warp"`` (see the module docstring).
        **kwargs: Passed to ``BaseDynamics``: ``hooks``, ``convergence_hook``, ``sampler``,
            ``refill_frequency``, ``sinks``, ``comm_mode``, ``buffer_config``, ``name``.

    Raises:
        ConfigurationError: A parameter out of range or an unknown backend.
    """

    def __init__(
        self, model: Any, n_steps: int = 1000, dt: ParameterValue = 1.0, *, backend: str = "auto", **kwargs: Any
    ) -> None:
        if backend not in BACKENDS:
            raise ConfigurationError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "warp" and not warp_available():
            raise MissingDependencyError(
                f"{type(self).__name__}(backend='warp') needs warp-lang: pip install 'warp-lang>=1.5'"
            )
        #: The parameters by name, each a scalar, per-system tensor or field name.
        self.parameters: dict[str, SystemParameter] = {}
        super().__init__(model, n_steps=n_steps, dt=dt, **kwargs)
        self.declare("dt", dt, unit="fs", low=0.0, low_open=True)
        self.backend = backend
        self.active_backend: str | None = None
        self.work = Workspace()
        self._reads_user_fields = False
        self._warp: Any = None

    @staticmethod
    def _check_dt(dt: Any) -> Any:
        # dt may be a field name here; SystemParameter checks every form (see declare).
        return dt

    def declare(self, name: str, value: ParameterValue, **rules: Any) -> SystemParameter:
        """Register parameter ``name`` (see :class:`SystemParameter` for ``rules``)."""
        param = SystemParameter(name, value, **rules)
        self.parameters[name] = param
        return param

    def own_field(self, name: str) -> str:
        """The batch field holding this stage's per-system tensor ``name`` (unique per stage)."""
        return f"stage{self.status_code}_{name}"

    # ------------------------------------------------------------------ run lifecycle
    def setup(self, batch: Batch) -> None:
        """Bind parameters, choose the backend and create state fields (once per run)."""
        run = self.context.run
        why_not = ""
        if run is not None and run.refills:
            why_not = "this run refills systems from a sampler, which brings systems the tensor has no value for"
        elif batch.num_graphs == 0:
            why_not = "this stage starts without systems (a downstream pipeline rank)"
        for param in self.parameters.values():
            param.bind(batch, self.own_field(param.name), tensor_allowed=not why_not, why_not=why_not)
        self.active_backend = self._choose_backend(batch.device)
        if self.active_backend == "warp" and batch.positions.dtype not in (torch.float32, torch.float64):
            raise ConfigurationError(
                f"{self.name}: the Warp kernels take float32 or float64 positions, got "
                f"{batch.positions.dtype}; convert the batch or pass backend='torch'"
            )
        self._reads_user_fields = any(p.varies for p in self.parameters.values())
        self.create_state(batch)

    #: The backend ``"auto"`` picks on a CPU when warp-lang is installed (see the module docstring).
    cpu_backend = "torch"

    def _choose_backend(self, device: torch.device) -> str:
        if self.backend != "auto":
            return self.backend
        if not warp_available():
            return "torch"
        return "warp" if device.type == "cuda" else self.cpu_backend

    def create_state(self, batch: Batch) -> None:
        """Create the per-system state fields this integrator keeps (subclasses)."""

    def ensure_field(self, batch: Batch, name: str, tail: tuple[int, ...], dtype: torch.dtype, level: str) -> None:
        """Give ``batch`` field ``name`` (zeros) unless it has one of this dtype and shape."""
        if name in batch:
            t = getattr(batch, name)
            if t.dtype == dtype and tuple(t.shape[1:]) == tail:
                return
            delattr(batch, name)  # another integrator's layout under the same name
        rows = batch.num_nodes if level == "node" else batch.num_graphs
        batch.set_field(name, torch.zeros((rows, *tail), dtype=dtype, device=batch.device), level)

    def pre_update(self, batch: Batch) -> None:
        if self.active_backend == "warp":
            self.warp_pre_update(batch)
        else:
            self.torch_pre_update(batch)

    def post_update(self, batch: Batch) -> None:
        if self.active_backend == "warp":
            self.warp_post_update(batch)
        else:
            self.torch_post_update(batch)

    def torch_pre_update(self, batch: Batch) -> None:
        raise NotImplementedError

    def torch_post_update(self, batch: Batch) -> None:
        raise NotImplementedError

    def warp_pre_update(self, batch: Batch) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no Warp path; use backend='torch'")

    def warp_post_update(self, batch: Batch) -> None:
        raise NotImplementedError(f"{type(self).__name__} has no Warp path; use backend='torch'")

    @property
    def warp_kernels(self) -> Any:
        """The Warp kernel module (imported on first use)."""
        if self._warp is None:
            from alchemi_integrators import warp_kernels

            self._warp = warp_kernels
        return self._warp

    # ------------------------------------------------------------------ helpers for steps
    def values(self, name: str, batch: Batch) -> float | torch.Tensor:
        """Parameter ``name`` as a Python number, or ``[B]`` values in the batch's dtype."""
        return self.parameters[name].values(batch, batch.positions.dtype)

    def per_system(self, name: str, batch: Batch) -> torch.Tensor:
        """Parameter ``name`` as ``[B]`` values (a scalar is broadcast once and kept)."""
        param = self.parameters[name]
        dtype = batch.positions.dtype
        if param.scalar is None:
            return param.per_system(batch, dtype)
        value = param.scalar
        return self.cached(
            f"param:{name}",
            batch,
            lambda: torch.full((batch.num_graphs,), value, dtype=dtype, device=batch.device),
            reads_fields=False,
            masks=False,
        )

    def cached(
        self, name: str, batch: Batch, build: Callable[[], Any], reads_fields: bool = True, masks: bool = True
    ) -> Any:
        """``build()``, kept by the engine while the batch's systems (and, with ``masks``, this
        stage's masks) are unchanged (``StepContext.derived``).

        Args:
            reads_fields: ``build`` reads parameters; when any parameter comes from a user's field
                (which may change any step) the value is rebuilt every step.
            masks: ``build`` reads the masks (or anything the engine rewrites with them). False:
                it reads only the batch's systems (a parameter broadcast, masses).
        """
        if reads_fields and self._reads_user_fields:
            return build()
        return self.context.derived(name, build, masks=masks)

    def to_atoms(self, batch: Batch, values: torch.Tensor, name: str) -> torch.Tensor:
        """Gather ``[B, k]`` per-system values to ``[V, k]`` per atom into a kept buffer."""
        tail = tuple(values.shape[1:])
        out = self.work.get(name, batch.num_nodes, batch.node_capacity, tail, values.dtype, values.device)
        torch.index_select(values, 0, batch.batch_idx, out=out)
        return out

    def active(self, batch: Batch) -> torch.Tensor | None:
        """``[B]`` 1.0 for systems this stage integrates now and 0.0 for the others (None: all)."""
        mask = self.context.system_mask
        if mask is None:
            return None
        return self.cached("active", batch, lambda: mask.to(batch.positions.dtype), reads_fields=False)

    def __repr__(self) -> str:
        params = ", ".join(repr(p) for p in self.parameters.values())
        return f"{self.name}(n_steps={self.n_steps}, {params}, backend={self.backend!r})"


class MDIntegrator(Integrator):
    """An integrator of Newton's equations (with or without a thermostat).

    Args:
        initial_temperature: When given (K; number, ``[B]`` tensor or field name), systems that
            enter this stage get fresh Maxwell-Boltzmann velocities at this temperature with their
            COM motion removed, e.g. after a FIRE relaxation in a fused relax+MD stage. None keeps
            the velocities systems bring.
        random_seed: Seeds this integrator's random numbers (initial velocities, Langevin noise),
            so a run is reproducible. None draws a seed, readable as ``random_seed`` afterwards.
        **kwargs: See :class:`Integrator`.
    """

    def __init__(
        self,
        model: Any,
        n_steps: int = 1000,
        dt: ParameterValue = 1.0,
        *,
        initial_temperature: ParameterValue | None = None,
        random_seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, n_steps=n_steps, dt=dt, **kwargs)
        if initial_temperature is not None:
            self.declare("initial_temperature", initial_temperature, unit="K", low=0.0)
        self.random_seed = int(random_seed) if random_seed is not None else secrets.randbits(63)
        self._generators: dict[torch.device, torch.Generator] = {}

    def generator(self, device: torch.device) -> torch.Generator:
        """This integrator's random generator on ``device`` (seeded once, continued across runs)."""
        gen = self._generators.get(device)
        if gen is None:
            gen = torch.Generator(device=device).manual_seed(self.random_seed)
            self._generators[device] = gen
        return gen

    def state_dict(self) -> dict[str, Any]:
        """The random state, for checkpoints: the seed and each device's generator state.

        Everything else an integrator keeps is in batch fields, which travel with the batch.
        The result holds only ints, strings and uint8 tensors (``torch.load(weights_only=True)``).
        """
        return {
            "random_seed": self.random_seed,
            "generators": {str(dev): gen.get_state() for dev, gen in self._generators.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the random streams saved by :meth:`state_dict`."""
        self.random_seed = int(state["random_seed"])
        self._generators.clear()
        for dev, gen_state in state["generators"].items():
            self.generator(torch.device(dev)).set_state(gen_state)

    def init_state(self, batch: Batch, entering: torch.Tensor) -> None:
        if "initial_temperature" in self.parameters:
            from alchemi_integrators.thermo import draw_velocities

            temps = self.per_system("initial_temperature", batch)
            draw_velocities(batch, temps, generator=self.generator(batch.device), mask=entering)

