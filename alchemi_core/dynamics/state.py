"""What an engine is made of: its sub-stages, its configuration and its counters.

The engine (``alchemi_core.dynamics.engine``) is built in layers, one idea per module, each
layer a class that adds methods to the one below:

1. :class:`EngineState` (here): the sub-stages, the run's configuration and counters.
2. ``masks.Masks``: which systems and atoms each stage owns, published in its ``StepContext``.
3. ``step.StepLoop``: the step (integrator halves around the model forward), its CUDA-graph
   capture and replay, and the hook points inside it.
4. ``measure.Measuring``: a check's device work up to its one read-back (quarantine, ``fmax``,
   convergence, budgets), captured as a CUDA graph where it can be (``check_capture``).
5. ``admission.Admission``: what the check's read-back says (graduation to sinks, refill from
   the sampler, admission of new systems).
6. ``engine.Engine``: preparing a run, running it, the once-per-run hooks.

Checkpoints (``checkpoint``) read and restore the counters kept here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from alchemi_core.dynamics.capture import gpu_index, retire_graph
from alchemi_core.dynamics.check_capture import CheckCapture
from alchemi_core.dynamics.constraints import Constraints
from alchemi_core.dynamics.context import RunView, StepContext
from alchemi_core.dynamics.convergence import ConvergenceHook
from alchemi_core.dynamics.hook import HookTable
from alchemi_core.dynamics.identity import SystemIds
from alchemi_core.dynamics.quarantine import HEALTH_INTERVAL, HealthCheck, PendingCodes, Quarantined
from alchemi_core.dynamics.readback import FlagReadBack
from alchemi_core.dynamics.status_flow import check_status_flow
from alchemi_core.dynamics.weak import alive, ref_to
from alchemi_core.errors import ConfigurationError
from alchemi_core.tuning import CoreTuning

if TYPE_CHECKING:
    import torch

    from alchemi_core.data import Batch
    from alchemi_core.dynamics.base import BaseDynamics
    from alchemi_core.dynamics.sampler import SizeAwareSampler
    from alchemi_core.dynamics.sinks import DataSink

#: A step index no run reaches.
NEVER = 2**62


class SubStage:
    """One stage inside an engine: its status code, budget, where its systems go next, and the
    ``StepContext`` its integrator and hooks read."""

    __slots__ = (
        "code", "_dynamics", "budget", "target", "conv", "source", "sys_mask", "node_weight",
        "weighted_inv_mass", "buffers_version", "hooks", "context",
    )

    def __init__(self, code: int, dynamics: BaseDynamics, target: int) -> None:
        self.code = int(code)
        # Weak: the stage owns its engine, not the other way round (``alchemi_core.dynamics.weak``).
        self._dynamics = ref_to(dynamics)
        self.budget = int(dynamics.n_steps)
        self.target = int(target)
        self.conv: ConvergenceHook | None = dynamics.convergence_hook
        self.source = self.code
        if self.conv is not None:
            if self.conv.source_status is not None:
                self.source = self.conv.source_status
            if self.conv.target_status is not None:
                self.target = self.conv.target_status
        self.sys_mask: torch.Tensor | None = None
        self.node_weight: torch.Tensor | None = None
        self.weighted_inv_mass: torch.Tensor | None = None
        self.buffers_version = -1
        #: Per hook point, this stage's ``(frequency, hook, stage)`` entries.
        self.hooks: HookTable = ()
        self.context = StepContext(self.code)

    @property
    def dynamics(self) -> BaseDynamics:
        """The stage's dynamics (held by whoever runs the engine: the stage itself, a fused stage,
        a pipeline)."""
        return alive(self._dynamics, "stage")


class EngineState:
    """The sub-stages, configuration and counters of an engine (see the module docstring).

    Args:
        stages: ``(status_code, dynamics)`` pairs, in order.
        entry_status: Status of systems entering (from the sampler or a fresh batch).
        exit_status: Status at which a system has graduated.
        sinks: Graduated systems go to the first sink with room, in order.
        sampler: Refills graduated slots when given.
        refill_frequency: Steps between graduation/refill checks.
        graduate_on_budget: Whether a system that used a stage's ``n_steps`` moves on. False for a
            plain single stage, which instead runs ``n_steps`` steps in all.
        owner: The object users called ``run`` on (for lifecycle hooks and messages).
        hooks: Extra hooks applying to all systems (a fused stage's own).
    """

    def __init__(
        self,
        stages: Sequence[tuple[int, BaseDynamics]],
        *,
        entry_status: int,
        exit_status: int,
        sinks: Sequence[DataSink] = (),
        sampler: SizeAwareSampler | None = None,
        refill_frequency: int = 1,
        graduate_on_budget: bool = True,
        owner: Any = None,
        hooks: Sequence[Any] = (),
    ) -> None:
        if not stages:
            raise ConfigurationError("an engine needs at least one stage")
        codes = [int(c) for c, _ in stages]
        if len(set(codes)) != len(codes):
            raise ConfigurationError(f"sub-stage status codes must differ, got {codes}")
        self.entry_status = int(entry_status)
        self.exit_status = int(exit_status)
        if self.exit_status in codes:
            raise ConfigurationError(f"exit_status {exit_status} is also a sub-stage's status code")
        self.subs: list[SubStage] = []
        for i, (code, dyn) in enumerate(stages):
            nxt = codes[i + 1] if i + 1 < len(codes) else self.exit_status
            self.subs.append(SubStage(code, dyn, nxt))
        #: Whether a check's moves can bring a system into a stage (a fused stage's next one); where
        #: every move leaves the engine (a plain relaxation), a check need not ask the stages to
        #: set up newcomers: on W2 that was ten device operations at each check where some
        #: system converged, about half of them.
        self._moves_enter_stages = any(s.target in codes for s in self.subs)
        check_status_flow(codes, self.entry_status, self.exit_status,
                          [(s.code, s.source, s.target, s.dynamics.name) for s in self.subs if s.conv is not None])
        self.sinks = list(sinks)
        self.sampler = sampler
        self.refill_frequency = max(1, int(refill_frequency))
        self.graduate_on_budget = bool(graduate_on_budget)
        self._owner = None if owner is None else ref_to(owner)
        self.extra_hooks = list(hooks)
        self.models = list({id(s.dynamics.model): s.dynamics.model for s in self.subs}.values())
        self.masked = len(self.subs) > 1 or graduate_on_budget or any(s.conv is not None for s in self.subs)
        freqs = [s.conv.frequency for s in self.subs if s.conv is not None]
        if sampler is not None or (graduate_on_budget and self.sinks):
            freqs.append(self.refill_frequency)
        if graduate_on_budget and not freqs:
            freqs.append(1)
        self.check_interval = math.gcd(*freqs) if freqs else 0
        # With checks more than a step apart, an extra check is scheduled for the step at which
        # the first active system uses its budget, so every system gets exactly n_steps in a
        # stage whatever the check interval (a fused stage and a pipeline then agree).
        self._schedule_budgets = self.graduate_on_budget and self.check_interval > 1
        self._budget_check = NEVER
        keys: set[str] = set()
        for s in self.subs:
            if s.conv is not None:
                keys |= s.conv.keys
        self.track_fmax = "fmax" in keys
        self.track_energy_change = "energy_change" in keys
        #: Atoms and components held fixed, applied around every step (``constraints``); held
        #: components follow the cell where some stage moves cells.
        self.constraints = Constraints()
        self.moves_cells = any(getattr(s.dynamics, "moves_cell", False) for s in self.subs)
        self.needs_stress = any(getattr(s.dynamics, "needs_stress", False) for s in self.subs) or any(
            getattr(h, "needs_stress", False) for h in self._all_hooks()
        )
        self.batch: Batch | None = None
        self.step_count = 0
        self.table: HookTable = ()
        self.host_results: DataSink | None = None
        self._inv_mass: torch.Tensor | None = None
        self._inv_mass_version = -1
        #: The masks describe the batch of this version, and no status changed since: a check that
        #: changes nothing leaves them (and the integrators' caches keyed on them) as they are.
        self._masks_version = -1
        self._masks_stale = True
        self._masks_status: torch.Tensor | None = None
        self._inner_hooks = False
        self._inner_frequencies: tuple[int, ...] = ()
        self.owner_hooks: HookTable = ()
        self.done = False
        #: Capture the step as a CUDA graph on GPUs (``compile()``); how often it was captured.
        #: A model whose own code reads back from the device says ``cuda_graphs = False``: its
        #: stage then steps eagerly even when compiled (a capture would fail or replay stale values).
        self.graph_requested = bool(getattr(owner, "compile_step", False)) and all(
            getattr(m, "cuda_graphs", True) for m in self.models
        )
        self.graph_captures = 0
        #: The owner's per-device choices, if it was given some (:meth:`tuning`).
        self._given_tuning: CoreTuning | None = getattr(owner, "tuning", None)
        #: The checks' device work, captured too where it can be (``check_capture``).
        self._check_capture = CheckCapture()
        self._flags = FlagReadBack()
        #: The context of the run's owner: a plain stage's own; a fused stage's covers every
        #: system of its sub-stages (its masks are kept when it has hooks of its own).
        self.run_view = RunView(self)
        single = len(self.subs) == 1 and owner is self.subs[0].dynamics
        self.owner_context = self.subs[0].context if single else StepContext(self.entry_status)
        self._owner_buffers_version = -1
        #: Every distinct context of this run (a plain stage's owner context is its own).
        self._contexts = tuple({id(c): c for c in (*(s.context for s in self.subs), self.owner_context)}.values())
        for ctx in self._contexts:
            ctx.run = self.run_view
        self._graph: Any = None
        self._graph_key = -1
        #: False on pipeline ranks that pass graduates downstream instead of to sinks.
        self.graduate_to_sinks = True
        #: Systems moved out to sinks so far.
        self.written_count = 0
        #: Systems taken in from the initial batch and the sampler so far.
        self.loaded_count = 0
        #: Systems the sampler handed out so far (checkpoints check it against its position).
        self.sampled_count = 0
        #: Names the run in its checkpoints (set when the first one is written, kept on resume).
        self.run_id: str | None = None
        #: Every system_id taken in: two structures with one id would be merged in the sinks.
        self.ids = SystemIds()
        #: Fields the caller gave as ``[B, 1]`` (nvalchemi's shape), kept ``[B]`` while running.
        self.user_shapes: dict[str, int] = {}
        #: Finds structures that went bad, at checks; those found so far, in order.
        self.health = HealthCheck.of(owner)
        self.quarantined: list[Quarantined] = []
        #: A run without checks still looks for bad structures this often, and at its end.
        self.health_every = HEALTH_INTERVAL if self.check_interval == 0 else 0
        #: Such a health check's codes, on their way to the host (read at the next one).
        self._health_pending: PendingCodes | None = None

    def _rewrites_masks_in_steps(self) -> bool:
        """Whether a step may rewrite the masks itself (the masks' part of the engine says)."""
        return False

    def tuning(self) -> CoreTuning:
        """This run's per-device choices: the owner's ``tuning``, else those measured for the
        batch's device (a CPU's before there is a batch)."""
        if self._given_tuning is not None:
            return self._given_tuning
        return CoreTuning.for_device(self.batch.device if self.batch is not None else "cpu")

    @property
    def owner(self) -> Any:
        """The object users called ``run`` on (held weakly: it owns this engine)."""
        return None if self._owner is None else alive(self._owner, "owner")

    @property
    def mask_version(self) -> int:
        """The version of the masks the stages' contexts hold now."""
        return self.subs[0].context.version

    def release_graphs(self) -> None:
        """Drop the captured step and check graphs (the run has ended): their memory pools serve
        the next captures on this GPU (``capture.retire_graph``). A later step on this engine
        captures again."""
        self._retire_step_graph()
        self._graph_key = -1
        self._check_capture.release()

    def release_run(self) -> None:
        """The run has ended: drop its graphs and the contexts' derived values, whose builds may
        close over their stages. A later ``step()`` on this engine rebuilds both."""
        self.release_graphs()
        for ctx in self._contexts:
            ctx.refresh_derived(systems_changed=True)

    def _retire_step_graph(self) -> None:
        """Drop the captured step (the next step captures anew); its memory pool serves the next
        capture on this GPU (``capture.retire_graph``)."""
        graph, self._graph = self._graph, None
        if graph is not None:
            assert self.batch is not None
            retire_graph(graph, gpu_index(self.batch.device))

    def _all_hooks(self) -> list[Any]:
        out = list(self.extra_hooks)
        for s in self.subs:
            out.extend(s.dynamics.hooks)
        return out
