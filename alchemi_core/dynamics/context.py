"""``StepContext``: everything an integrator or a hook of one stage may read during a run.

The engine keeps one context per stage and rewrites it only when the set of systems changes
(at checks, refills, arrivals on a pipeline rank); between those moments a step only advances
``step``. An integrator reads it as ``self.context`` in ``pre_update``/``post_update``; a hook,
called as ``hook(batch, dynamics)``, reads ``dynamics.context`` (a fused stage's own hooks get the
fused stage's context, which covers the systems of all its sub-stages).

Fields:

* ``batch``: the active batch (None before a run).
* ``system_mask``: ``[B]`` bool, the systems this stage integrates now; None means every system.
* ``node_weight``: ``[V, 1]`` 1.0 for the atoms this stage moves, 0.0 for the others (atoms of
  other stages, graduated systems, atoms marked ``frozen``); None means every atom.
* ``inv_mass``: ``[V, 1]`` acceleration per unit force (Å/fs² per eV/Å).
* ``weighted_inv_mass``: ``inv_mass * node_weight``: a kick ``v += dt * F * weighted_inv_mass``
  leaves atoms of other stages alone in one fused operation.
* ``step``: the index of the current step in the run (0, 1, ...).
* ``version``: a number that changes whenever the tensors above are rewritten (new systems,
  systems moving between stages, a new run); unique across runs and engines, so a cache keyed
  on it alone is never stale.
* ``stage_code``: the status code of the systems this stage integrates.

The tensors are rewritten in place while the set of systems keeps its size, so a captured CUDA
graph keeps reading them; they are reallocated when the batch's layout changes. What a stage
derives from them it registers once with :meth:`StepContext.derived`: the engine owns that value
and keeps it right for the masks (the one rule that keeps a captured step valid across checks).

Example:
    >>> from alchemi_core.dynamics import DemoDynamics
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> from alchemi_core.testing import make_batch
    >>> md = DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5)
    >>> batch = md.run(make_batch([2, 3]))
    >>> ctx = md.context
    >>> ctx.step, ctx.system_mask is None, tuple(ctx.inv_mass.shape)
    (2, True, (5, 1))
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from alchemi_core.dynamics.weak import alive, ref_to

if TYPE_CHECKING:
    from alchemi_core.data import Batch

_versions = itertools.count(1)


def next_version() -> int:
    """A context version no other context has had (process-wide)."""
    return next(_versions)


class StepContext:
    """What one stage owns in the current run (see the module docstring).

    Args:
        stage_code: The status code of the stage's systems.

    Example:
        >>> import torch
        >>> from alchemi_core.testing import make_batch
        >>> batch = make_batch([2, 1])
        >>> ctx = StepContext.standalone(batch, system_mask=torch.tensor([False, True]))
        >>> ctx.node_weight.view(-1).tolist()
        [0.0, 0.0, 1.0]
    """

    __slots__ = (
        "batch", "stage_code", "system_mask", "node_weight", "inv_mass", "weighted_inv_mass", "step",
        "version", "run", "keeps_builds", "_derived",
    )

    def __init__(self, stage_code: int = 0) -> None:
        self.batch: Batch | None = None
        self.stage_code = int(stage_code)
        self.system_mask: torch.Tensor | None = None
        self.node_weight: torch.Tensor | None = None
        self.inv_mass: torch.Tensor | None = None
        self.weighted_inv_mass: torch.Tensor | None = None
        self.step = 0
        self.version = 0
        #: The run this context belongs to (counts and limits; None outside a run).
        self.run: RunView | None = None
        #: Set by the engine where it must rebuild derived values without the stage's help (a
        #: captured step replays, or the step rewrites the masks): their builds are kept then.
        self.keeps_builds = False
        #: What :meth:`derived` holds: name -> (value, build or None, reads the masks).
        self._derived: dict[str, tuple[Any, Callable[[], Any] | None, bool]] = {}

    def derived(self, name: str, build: Callable[[], Any], *, masks: bool = True) -> Any:
        """The value ``build()`` gives, built at the first call and then owned by the engine.

        A stage registers here each value it derives from its masks (``masks=True``), or from the
        batch's systems alone (``masks=False``: a parameter broadcast to ``[B]``, masses), instead
        of keeping it itself. Whenever the engine rewrites the masks it rebuilds the values that
        read them, in place (on the host after a check, or inside the captured step where the step
        rewrites the masks), so a captured CUDA graph that reads them stays right; when the
        systems change it drops every value, and the next call builds it anew; a run's end drops
        them all. ``build`` must launch device work only (no read-back) where the stage says
        ``mask_values_in_step``.

        Args:
            name: The value's name, unique within the stage.
            build: Makes the value: a tensor, a number, or a tuple of them.
            masks: Whether ``build`` reads the masks (or anything rewritten with them).

        Example:
            >>> from alchemi_core.testing import make_batch
            >>> ctx = StepContext.standalone(make_batch([2, 1]), system_mask=torch.tensor([True, False]))
            >>> active = ctx.derived("active", lambda: ctx.system_mask.to(torch.float32))
            >>> ctx.derived("active", lambda: None) is active  # built once
            True
        """
        held = self._derived.get(name)
        if held is not None:
            return held[0]
        value = build()
        self._derived[name] = (value, build if self.keeps_builds else None, masks)
        return value

    def refresh_derived(self, systems_changed: bool) -> bool:
        """The engine rewrote the masks: rebuild in place each value that reads them (or drop it
        where its build was not kept); ``systems_changed`` (or mask buffers reallocated) drops
        every value. False where a rebuilt value changed its layout: it was replaced, and a
        captured step that read the old one must be captured anew."""
        held = self._derived
        if systems_changed:
            held.clear()
            return True
        kept = True
        for name, (value, build, masks) in list(held.items()):
            if not masks:
                continue
            if build is None:
                del held[name]
                continue
            new = build()
            if not _copy_into(value, new):
                held[name] = (new, build, masks)
                kept = False
        return kept

    @classmethod
    def standalone(cls, batch: Batch, system_mask: torch.Tensor | None = None, step: int = 0) -> StepContext:
        """A context for calling a hook or an integrator on ``batch`` outside a run (tests).

        Args:
            batch: The systems; its ``atomic_masses`` (or atomic numbers) give ``inv_mass``.
            system_mask: ``[B]`` bool, the systems the stage owns (None: all).
            step: The step index to report.
        """
        from alchemi_core.data.elements import masses_for
        from alchemi_core.units import ACCELERATION

        ctx = cls()
        masses = batch.atomic_masses if "atomic_masses" in batch else masses_for(
            batch.atomic_numbers, batch.positions.dtype
        )
        ctx.batch = batch
        ctx.inv_mass = (ACCELERATION / masses).unsqueeze(-1)
        ctx.system_mask = system_mask
        if system_mask is None:
            ctx.weighted_inv_mass = ctx.inv_mass
        else:
            weight = system_mask.index_select(0, batch.batch_idx).unsqueeze(-1).to(batch.positions.dtype)
            ctx.node_weight = weight
            ctx.weighted_inv_mass = ctx.inv_mass * weight
        ctx.step = int(step)
        ctx.version = next_version()
        return ctx

    def __repr__(self) -> str:
        owned = "all" if self.system_mask is None else "masked"
        return f"StepContext(stage_code={self.stage_code}, step={self.step}, version={self.version}, systems={owned})"


class RunView:
    """Read-only facts about the run a context belongs to, for hooks that report on it.

    Example:
        >>> from alchemi_core.dynamics import DemoDynamics
        >>> from alchemi_core.models.demo import DemoModelWrapper
        >>> from alchemi_core.testing import make_batch
        >>> md = DemoDynamics(model=DemoModelWrapper(), n_steps=4, dt=0.5)
        >>> _ = md.run(make_batch([2]))
        >>> run = md.context.run
        >>> run.steps_done, run.exit_status, run.ends_on_graduation
        (4, 1, False)
    """

    __slots__ = ("_run",)

    def __init__(self, state: Any) -> None:
        # Weak: the run's state holds its stages' contexts, which hold this view (see
        # ``alchemi_core.dynamics.weak``); the stage that ran keeps the engine alive.
        self._run = ref_to(state)

    @property
    def _state(self) -> Any:
        """The run's ``state.RunState`` (its counters)."""
        return alive(self._run, "run")

    @property
    def steps_done(self) -> int:
        """Steps the run has completed."""
        return int(self._state.step_count)

    @property
    def exit_status(self) -> int:
        """The status at which a system has finished the run's stages."""
        return int(self._state.exit_status)

    @property
    def written_count(self) -> int:
        """Systems moved out to sinks (or passed downstream) so far."""
        return int(self._state.written_count)

    @property
    def loaded_count(self) -> int:
        """Systems taken in from the initial batch and the sampler so far."""
        return int(self._state.loaded_count)

    @property
    def refills(self) -> bool:
        """True when the run refills free slots from a sampler (systems arrive during the run)."""
        return self._state.sampler is not None

    @property
    def ends_on_graduation(self) -> bool:
        """True when the run ends once every system graduated; False for a plain run of
        ``n_steps`` steps."""
        return bool(self._state.graduate_on_budget)


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
