"""What every integrator of this package shares: parameters, state fields, scratch space.

An integrator here is a :class:`~alchemi_core.dynamics.BaseDynamics` whose physical parameters are
:class:`~alchemi_integrators.parameters.SystemParameter` objects (a scalar, one value per system,
or a field name), whose per-system state lives in batch fields created in ``setup`` and reset for
entering systems in ``init_state``, and whose step is one implementation on every device: fused
Warp kernels (:mod:`~alchemi_integrators.warp_kernels`) launched on torch's current stream,
zero-copy on the batch's tensors, the same on a CPU as on a GPU.

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
from alchemi_core.errors import ConfigurationError
from alchemi_core.workspace import Workspace
from alchemi_integrators.parameters import ParameterValue, SystemParameter

if TYPE_CHECKING:
    from alchemi_core.data import Batch

__all__ = ["Integrator", "MDIntegrator", "Workspace"]


class Integrator(BaseDynamics):
    """Base class of this package's integrators (see the module docstring).

    Args:
        model: Returns ``energy`` ``[B, 1]`` and ``forces`` ``[V, 3]`` for a batch.
        n_steps: Steps of ``run()`` (each system's budget inside fused stages and pipelines).
        dt: Time step in fs: a number, ``[B]`` tensor, or the name of a system-level field.
        **kwargs: Passed to ``BaseDynamics``: ``hooks``, ``convergence_hook``, ``sampler``,
            ``refill_frequency``, ``sinks``, ``comm_mode``, ``buffer_config``, ``name``.

    Raises:
        ConfigurationError: A parameter out of range, or ``backend`` (removed: there is one
            implementation).
    """

    def __init__(self, model: Any, n_steps: int = 1000, dt: ParameterValue = 1.0, **kwargs: Any) -> None:
        if "backend" in kwargs:
            raise ConfigurationError(
                f"{type(self).__name__}: backend={kwargs['backend']!r} is no longer an option: every integrator "
                "has one implementation, its Warp kernels, on CPUs and GPUs alike; drop the argument"
            )
        #: The parameters by name, each a scalar, per-system tensor or field name.
        self.parameters: dict[str, SystemParameter] = {}
        super().__init__(model, n_steps=n_steps, dt=dt, **kwargs)
        self.declare("dt", dt, unit="fs", low=0.0, low_open=True)
        self.work = Workspace()
        self._reads_user_fields = False

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
        """Bind parameters and create state fields (once per run)."""
        run = self.context.run
        why_not = ""
        if run is not None and run.refills:
            why_not = "this run refills systems from a sampler, which brings systems the tensor has no value for"
        elif batch.num_graphs == 0:
            why_not = "this stage starts without systems (a downstream pipeline rank)"
        for param in self.parameters.values():
            param.bind(batch, self.own_field(param.name), tensor_allowed=not why_not, why_not=why_not)
        if batch.positions.dtype not in (torch.float32, torch.float64):
            raise ConfigurationError(
                f"{self.name}: the Warp kernels take float32 or float64 positions, got "
                f"{batch.positions.dtype}; convert the batch (batch.to(torch.float32))"
            )
        self._reads_user_fields = any(p.varies for p in self.parameters.values())
        self.create_state(batch)


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

    # ------------------------------------------------------------------ helpers for steps
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

    def active(self, batch: Batch) -> torch.Tensor | None:
        """``[B]`` 1.0 for systems this stage integrates now and 0.0 for the others (None: all)."""
        mask = self.context.system_mask
        if mask is None:
            return None
        return self.cached("active", batch, lambda: mask.to(batch.positions.dtype), reads_fields=False)

    def __repr__(self) -> str:
        params = ", ".join(repr(p) for p in self.parameters.values())
        return f"{self.name}(n_steps={self.n_steps}, {params})"


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

