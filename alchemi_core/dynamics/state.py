"""What a run holds: its sub-stages, configuration, batch, counters and captured graphs.

The engine (``alchemi_core.dynamics.engine``) is one :class:`RunState` and the collaborators that
act on it, each given the state and the batch (``masks``, ``step``, ``checks``, ``admission``).
Checkpoints (``checkpoint``) read and restore the counters kept here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch

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
    from alchemi_core.data import Batch
    from alchemi_core.dynamics.base import BaseDynamics
    from alchemi_core.dynamics.sampler import SizeAwareSampler
    from alchemi_core.dynamics.sinks import DataSink

#: A step index no run reaches.
NEVER = 2**62


class SubStage:
    """One stage inside an engine: its status code, budget, where its systems go next, its masks
    and the ``StepContext`` its integrator and hooks read."""

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


@attrs.define(eq=False)
class RunState:
    """Everything one run holds (see the module docstring); built by :meth:`of`."""

    # ------------------------------------------------------------------ configuration
    subs: list[SubStage]
    entry_status: int
    exit_status: int
    sinks: list[DataSink]
    sampler: SizeAwareSampler | None
    refill_frequency: int
    #: Whether a system that used a stage's ``n_steps`` moves on. False for a plain single stage,
    #: which instead runs ``n_steps`` steps in all.
    graduate_on_budget: bool
    owner_ref: Callable[[], Any] | None
    #: Extra hooks applying to all systems (a fused stage's own).
    extra_hooks: list[Any]
    models: list[Any]
    #: Whether each stage steps only its own systems (several stages, budgets or convergence).
    masked: bool
    check_interval: int
    #: Whether a check's moves can bring a system into a stage (a fused stage's next one); where
    #: every move leaves the engine (a plain relaxation), a check need not set up newcomers.
    moves_enter_stages: bool
    #: With checks more than a step apart, an extra check is scheduled for the step at which the
    #: first active system uses its budget, so every system gets exactly n_steps in a stage.
    schedule_budgets: bool
    track_fmax: bool
    track_energy_change: bool
    moves_cells: bool
    needs_stress: bool
    #: Whether systems entering need forces before their first step (the engine then evaluates
    #: the model at a run's start and after a refill); a run of stages that move nothing does not.
    forces_on_entry: bool
    #: Capture the step as a CUDA graph on GPUs (``compile()``). A model whose own code reads back
    #: from the device says ``cuda_graphs = False``: its stage then steps eagerly.
    graph_requested: bool
    #: The owner's per-device choices, if it was given some (:meth:`tuning`).
    given_tuning: CoreTuning | None
    #: Finds structures that went bad, at checks.
    health: HealthCheck
    #: A run without checks still looks for bad structures this often, and at its end.
    health_every: int
    #: The context of the run's owner: a plain stage's own; a fused stage's covers every system of
    #: its sub-stages (its masks are kept when it has hooks of its own).
    owner_context: StepContext
    #: Every distinct context of this run.
    contexts: tuple[StepContext, ...]
    run_view: RunView | None = None

    # ------------------------------------------------------------------ the run
    batch: Batch | None = None
    step_count: int = 0
    done: bool = False
    #: Per hook point, every hook's entries; the owner's own; the inner points' frequencies.
    table: HookTable = ()
    owner_hooks: HookTable = ()
    inner_hooks: bool = False
    inner_frequencies: tuple[int, ...] = ()
    #: Atoms and components held fixed, applied around every step (``constraints``).
    constraints: Constraints = attrs.Factory(Constraints)
    #: ``[V, 1]`` inverse masses and the batch version they are for.
    inv_mass: torch.Tensor | None = None
    inv_mass_version: int = -1
    #: The masks describe the batch of this version, and no status changed since: a check that
    #: changes nothing leaves them (and the values derived from them) as they are.
    masks_version: int = -1
    masks_stale: bool = True
    #: The statuses the masks were written for.
    masks_status: torch.Tensor | None = None
    owner_buffers_version: int = -1
    budget_check: int = NEVER
    #: This run's steps rewrite the masks at their start (``Masks.may_write_in_step``).
    masks_in_step: bool = False
    #: The captured step, the batch version it was captured for, how often it was captured.
    graph: Any = None
    graph_key: int = -1
    graph_captures: int = 0
    #: The checks' device work, captured too where it can be (``check_capture``).
    check_capture: CheckCapture = attrs.Factory(CheckCapture)
    flags: FlagReadBack = attrs.Factory(FlagReadBack)
    #: Whether this run's checks may run the next step ahead, and the step count it stops at.
    ahead_on: bool = False
    ahead_until: int | None = None
    #: The step whose device work a check queued already (-1: none); how many were.
    ran_ahead: int = -1
    steps_run_ahead: int = 0
    #: False on pipeline ranks that pass graduates downstream instead of to sinks.
    graduate_to_sinks: bool = True
    #: Without sinks, the unbounded ``HostMemory`` that ``run()`` returns.
    host_results: DataSink | None = None
    #: Systems moved out to sinks, taken in (initial batch and sampler), handed out by the sampler.
    written_count: int = 0
    loaded_count: int = 0
    sampled_count: int = 0
    #: Names the run in its checkpoints (set when the first one is written, kept on resume).
    run_id: str | None = None
    #: Every system_id taken in: two structures with one id would be merged in the sinks.
    ids: SystemIds = attrs.Factory(SystemIds)
    #: Fields the caller gave as ``[B, 1]`` (nvalchemi's shape), kept ``[B]`` while running.
    user_shapes: dict[str, int] = attrs.Factory(dict)
    quarantined: list[Quarantined] = attrs.Factory(list)
    #: A health check's codes on their way to the host (read at the next one).
    health_pending: PendingCodes | None = None

    @classmethod
    def of(
        cls,
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
    ) -> RunState:
        """The state of a run of ``stages``.

        Args:
            stages: ``(status_code, dynamics)`` pairs, in order.
            entry_status: Status of systems entering (from the sampler or a fresh batch).
            exit_status: Status at which a system has graduated.
            sinks: Graduated systems go to the first sink with room, in order.
            sampler: Refills graduated slots when given.
            refill_frequency: Steps between graduation/refill checks.
            graduate_on_budget: Whether a system that used a stage's ``n_steps`` moves on.
            owner: The object users called ``run`` on (for lifecycle hooks and messages).
            hooks: Extra hooks applying to all systems (a fused stage's own).

        Raises:
            ConfigurationError: No stages, repeated codes, or status codes that lead nowhere.
        """
        if not stages:
            raise ConfigurationError("an engine needs at least one stage")
        codes = [int(c) for c, _ in stages]
        if len(set(codes)) != len(codes):
            raise ConfigurationError(f"sub-stage status codes must differ, got {codes}")
        if int(exit_status) in codes:
            raise ConfigurationError(f"exit_status {exit_status} is also a sub-stage's status code")
        subs = [SubStage(code, dyn, codes[i + 1] if i + 1 < len(codes) else int(exit_status))
                for i, (code, dyn) in enumerate(stages)]
        check_status_flow(codes, int(entry_status), int(exit_status),
                          [(s.code, s.source, s.target, s.dynamics.name) for s in subs if s.conv is not None])
        sinks, graduate_on_budget = list(sinks), bool(graduate_on_budget)
        freqs = [s.conv.frequency for s in subs if s.conv is not None]
        if sampler is not None or (graduate_on_budget and sinks):
            freqs.append(max(1, int(refill_frequency)))
        if graduate_on_budget and not freqs:
            freqs.append(1)
        check_interval = math.gcd(*freqs) if freqs else 0
        keys: set[str] = set()
        for s in subs:
            if s.conv is not None:
                keys |= s.conv.keys
        models = list({id(s.dynamics.model): s.dynamics.model for s in subs}.values())
        all_hooks = [*hooks, *(h for s in subs for h in s.dynamics.hooks)]
        single = len(subs) == 1 and owner is subs[0].dynamics
        owner_context = subs[0].context if single else StepContext(int(entry_status))
        state = cls(
            subs=subs, entry_status=int(entry_status), exit_status=int(exit_status), sinks=sinks,
            sampler=sampler, refill_frequency=max(1, int(refill_frequency)),
            graduate_on_budget=graduate_on_budget, owner_ref=None if owner is None else ref_to(owner),
            extra_hooks=list(hooks), models=models,
            masked=len(subs) > 1 or graduate_on_budget or any(s.conv is not None for s in subs),
            check_interval=check_interval, moves_enter_stages=any(s.target in codes for s in subs),
            schedule_budgets=graduate_on_budget and check_interval > 1,
            track_fmax="fmax" in keys, track_energy_change="energy_change" in keys,
            moves_cells=any(getattr(s.dynamics, "moves_cell", False) for s in subs),
            needs_stress=any(getattr(x, "needs_stress", False) for x in (*(s.dynamics for s in subs), *all_hooks)),
            forces_on_entry=any(getattr(s.dynamics, "forces_on_entry", True) for s in subs),
            graph_requested=bool(getattr(owner, "compile_step", False))
            and all(getattr(m, "cuda_graphs", True) for m in models),
            given_tuning=getattr(owner, "tuning", None), health=HealthCheck.of(owner),
            health_every=HEALTH_INTERVAL if check_interval == 0 else 0, owner_context=owner_context,
            contexts=tuple({id(c): c for c in (*(s.context for s in subs), owner_context)}.values()),
        )
        state.run_view = RunView(state)
        for ctx in state.contexts:
            ctx.run = state.run_view
        return state

    @property
    def owner(self) -> Any:
        """The object users called ``run`` on (held weakly: it owns this engine)."""
        return None if self.owner_ref is None else alive(self.owner_ref, "owner")

    def tuning(self) -> CoreTuning:
        """This run's per-device choices: the owner's ``tuning``, else those measured for the
        batch's device (a CPU's before there is a batch)."""
        if self.given_tuning is not None:
            return self.given_tuning
        return CoreTuning.for_device(self.batch.device if self.batch is not None else "cpu")

    def rewrites_masks_in_steps(self) -> bool:
        """Whether a step may rewrite the masks itself on this run's device (the rest of
        ``Masks.may_write_in_step`` changes from check to check); also what tells the contexts to
        keep the builds of their derived values."""
        device = self.batch.device.type if self.batch is not None else "cpu"
        return self.tuning().masks_in_step and (device != "cuda" or self.graph_requested)

    def active_mask(self) -> torch.Tensor:
        """``[B]`` bool: systems some stage still steps."""
        assert self.batch is not None
        status = self.batch.status
        active = torch.zeros_like(status, dtype=torch.bool)
        for s in self.subs:
            active |= status == s.code
        return active

    def graduated_mask(self) -> torch.Tensor:
        """``[B]`` bool: systems that leave at the next refill: at or past the exit status, or
        quarantined (negative status)."""
        assert self.batch is not None
        status = self.batch.status
        return (status >= self.exit_status) | (status < 0)
