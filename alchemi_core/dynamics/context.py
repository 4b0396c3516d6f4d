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
graph keeps reading them; they are reallocated when the batch's layout changes.

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
from typing import TYPE_CHECKING, Protocol, cast

from alchemi_core.dynamics.weak import alive, ref_to

if TYPE_CHECKING:
    import torch

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
        "version", "run",
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


class RunState(Protocol):
    """The counters of a run that :class:`RunView` exposes (the engine has them)."""

    @property
    def step_count(self) -> int: ...
    @property
    def exit_status(self) -> int: ...
    @property
    def written_count(self) -> int: ...
    @property
    def loaded_count(self) -> int: ...
    @property
    def graduate_on_budget(self) -> bool: ...
    @property
    def sampler(self) -> object | None: ...
    @property
    def refreshes_in_place(self) -> bool: ...


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

    def __init__(self, engine: RunState) -> None:
        # Weak: the engine holds its stages' contexts, which hold this view (see
        # ``alchemi_core.dynamics.weak``); the stage that ran keeps the engine alive.
        self._run = ref_to(engine)

    @property
    def _engine(self) -> RunState:
        return cast("RunState", alive(self._run, "run"))

    @property
    def steps_done(self) -> int:
        """Steps the run has completed."""
        return int(self._engine.step_count)

    @property
    def exit_status(self) -> int:
        """The status at which a system has finished the run's stages."""
        return int(self._engine.exit_status)

    @property
    def written_count(self) -> int:
        """Systems moved out to sinks (or passed downstream) so far."""
        return int(self._engine.written_count)

    @property
    def loaded_count(self) -> int:
        """Systems taken in from the initial batch and the sampler so far."""
        return int(self._engine.loaded_count)

    @property
    def refills(self) -> bool:
        """True when the run refills free slots from a sampler (systems arrive during the run)."""
        return self._engine.sampler is not None

    @property
    def refreshes_in_place(self) -> bool:
        """True when values a stage derives from its masks may have to be rebuilt in place: the
        run replays a captured step (``compile()``) or rewrites the masks inside its steps."""
        return bool(self._engine.refreshes_in_place)

    @property
    def ends_on_graduation(self) -> bool:
        """True when the run ends once every system graduated; False for a plain run of
        ``n_steps`` steps."""
        return bool(self._engine.graduate_on_budget)
