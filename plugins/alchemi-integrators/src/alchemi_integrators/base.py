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
from collections.abc import Callable, Hashable
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
        #: Values derived from the masks and parameters: name -> (key, value, build, reads masks).
        #: ``build`` is kept only where a captured step may need the value refreshed in place
        #: (:meth:`_keeps_builds`): it closes over this integrator, and a stage driven by ``step()``
        #: alone would otherwise stay in a reference cycle, its batch's memory with it, until the
        #: cycle collector ran.
        self._cache: dict[str, tuple[Hashable, Any, Callable[[], Any] | None, bool]] = {}
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
        self._cache.clear()
        self._reads_user_fields = any(p.varies for p in self.parameters.values())
        self.create_state(batch)

    def release_run_state(self) -> None:
        """Empty the cache of mask-derived values at a run's end: its build functions close over
        this integrator (a cycle), and the next run's ``setup`` would empty it anyway."""
        self._cache.clear()

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
        """``build()``, reused while the batch's systems and this stage's masks are unchanged.

        Args:
            reads_fields: ``build`` reads parameters; when any parameter comes from a user's field
                (which may change any step) the value is rebuilt every step.
            masks: ``build`` reads the masks (or anything the engine rewrites with them). False:
                it reads only the batch's systems (a parameter broadcast, masses), and the value
                is kept until they change. On W2 (FIRE, a check every step) systems converge at
                about half the checks; each rewrote the masks and rebuilt eleven such values, two
                device operations each, on the host's time before the next step.
        """
        if reads_fields and self._reads_user_fields:
            return build()
        key = self._cache_key(batch, masks)
        hit = self._cache.get(name)
        if hit is not None and hit[0] == key:
            return hit[1]
        value = build()
        if hit is not None and _copy_into(hit[1], value):
            # Same layout, new masks: refreshed in place, so a captured CUDA graph that read the
            # old tensors sees the new values.
            value = hit[1]
        self._cache[name] = (key, value, build if self._keeps_builds() else None, masks)
        return value

    def _keeps_builds(self) -> bool:
        """Whether cached values may have to be rebuilt in place (see ``RunView.refreshes_in_place``)."""
        run = self.context.run
        return run is not None and run.refreshes_in_place

    def _cache_key(self, batch: Batch, masks: bool) -> Hashable:
        """What a cached value is valid for. The context's version changes whenever the engine
        rewrites the masks or the systems change, and is never reused; ``batch.version`` changes
        with the systems only (and ``setup`` empties the cache at each run's start)."""
        return self.context.version if masks else ("systems", id(batch), batch.version)

    def refresh_for_replay(self, batch: Batch) -> bool:
        """Rebuild every cached value for the current masks, in place (see ``BaseDynamics``).

        The step reads the masks and the batch's fields through tensors, and everything else it
        derives from them through :meth:`cached`, so refreshing the cache keeps a captured step
        right. False when a value cannot be refreshed in place (its shape or kind changed).
        """
        for name, (seen, old, build, masks) in list(self._cache.items()):
            key = self._cache_key(batch, masks)
            if seen == key:
                continue
            if build is None or not _copy_into(old, build()):
                return False
            self._cache[name] = (key, old, build, masks)
        return True

    def rebuild_mask_values(self, batch: Batch) -> bool:
        """Rebuild in place every cached value read from the masks, whatever its key says (see
        ``BaseDynamics``): the engine calls it inside a captured step that rewrites the masks
        itself. False where this integrator does not say its builds can be captured
        (``mask_values_in_step``: nothing done) or a value changed its layout (which takes a
        change of the batch's systems, after which the step is captured anew)."""
        if not self.mask_values_in_step:
            return False
        return all(build is not None and _copy_into(old, build())
                   for _, old, build, masks in list(self._cache.values()) if masks)

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


def _copy_into(old: Any, new: Any) -> bool:
    """Copy ``new`` into ``old`` in place where they have one layout: tensors of one shape, dtype
    and device, or tuples of such tensors, equal numbers and Nones. False, with nothing copied,
    where they differ."""
    if not _same_layout(old, new):
        return False
    for a, b in zip(old, new) if isinstance(old, tuple) else ((old, new),):
        if isinstance(a, torch.Tensor):
            a.copy_(b)
    return True


def _same_layout(old: Any, new: Any) -> bool:
    if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
        return old.shape == new.shape and old.dtype == new.dtype and old.device == new.device
    if isinstance(old, tuple) and isinstance(new, tuple):
        return len(old) == len(new) and all(
            not isinstance(a, tuple) and _same_layout(a, b) for a, b in zip(old, new)
        )
    if isinstance(old, (int, float)) and isinstance(new, (int, float)):
        return bool(old == new)
    return old is None and new is None  # a part a value has only in some layouts (absent in both)
