"""``Static``: one model evaluation per structure, no dynamics (screening, dataset labelling).

Each system takes exactly one step, whose model forward gives its energy and forces (and its stress
when ``compute_stress``); then it graduates to the sinks. Fed by a ``SizeAwareSampler`` the run is
inflight like any other stage: batches sized by the model's bytes per atom, each refill taking the
next structures, every structure written once (across a checkpoint and a resume too). A structure
whose result is not finite (atoms on top of each other, a model that fails on it) is quarantined
with its reason (:mod:`alchemi_core.dynamics.quarantine`) and the others finish.

The stage moves nothing, so a system entering it needs no forces: the engine skips the forward it
makes for newcomers when no stage of the run needs one (``forces_on_entry``), and each structure
costs one model evaluation.

Example:
    >>> import torch
    >>> from alchemi_core.data import Batch
    >>> from alchemi_core.dynamics.static import Static
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> from alchemi_core.testing import random_structures
    >>> batch = Batch.from_data_list(random_structures([3, 5], dtype=torch.float64))
    >>> stage = Static(DemoModelWrapper())
    >>> out = stage.run(batch)
    >>> out.energy.shape, out.forces.shape, stage.step_count
    (torch.Size([2, 1]), torch.Size([8, 3]), 1)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from alchemi_core.dynamics.base import BaseDynamics
from alchemi_core.dynamics.quarantine import DEFAULT_MAX_EXTENT
from alchemi_core.errors import ConfigurationError

if TYPE_CHECKING:
    from alchemi_core.data import Batch
    from alchemi_core.dynamics.convergence import ConvergenceHook
    from alchemi_core.dynamics.sampler import SizeAwareSampler
    from alchemi_core.dynamics.sinks import DataSink
    from alchemi_core.tuning import CoreTuning


class Static(BaseDynamics):
    """Evaluate every structure once (see the module docstring).

    Args:
        model: Returns ``energy`` and ``forces`` (and ``stress`` when asked) for a batch.
        compute_stress: Ask the model for the stress of every structure (each needs a cell).
        hooks: Per-step hooks (a snapshot hook, a progress bar).
        sampler: Feeds the run from a dataset, inflight.
        sinks: Where evaluated structures go, first sink with room first.
        refill_frequency: Steps between graduation/refill checks (1: every structure leaves right
            after its evaluation, which is what a stage of one step wants).
        convergence_hook: Refused when given (a workflow passes None): nothing converges here.
        name: A label for logs.
        strict: Raise on a structure whose result is not finite instead of quarantining it.
        max_extent: Largest bounding-box side (Å) before a structure counts as flown apart.
        tuning: The engine's per-device choices (``alchemi_core.tuning``).

    Raises:
        ConfigurationError: A convergence hook, or a value the base class refuses.
    """

    forces_on_entry = False

    def __init__(
        self,
        model: Any,
        compute_stress: bool = False,
        hooks: Sequence[Any] | None = None,
        sampler: SizeAwareSampler | None = None,
        sinks: Sequence[DataSink] | None = None,
        refill_frequency: int = 1,
        convergence_hook: ConvergenceHook | None = None,
        name: str | None = None,
        strict: bool = False,
        max_extent: float = DEFAULT_MAX_EXTENT,
        tuning: CoreTuning | None = None,
    ) -> None:
        if convergence_hook is not None:
            raise ConfigurationError(
                "integrator:static evaluates each structure once and converges nothing; drop its convergence "
                "criteria (converge = {...} in a workflow file)"
            )
        super().__init__(model, n_steps=1, hooks=hooks, sampler=sampler, refill_frequency=refill_frequency,
                         sinks=sinks, name=name, strict=strict, max_extent=max_extent, tuning=tuning)
        #: Whether the model's stress is asked for (the engine reads this at a run's start).
        self.needs_stress = bool(compute_stress)

    def pre_update(self, batch: Batch) -> None:
        """Nothing moves."""

    def post_update(self, batch: Batch) -> None:
        """The forward has written energy, forces and stress into the batch: nothing to do."""
