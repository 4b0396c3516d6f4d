"""``FusedStage``: several dynamics stages on one device, sharing one model forward per step.

Systems carry a status; sub-stage *i* integrates the systems whose status is its code. A system
moves to the next stage when the stage's convergence hook says it converged or when it has used
the stage's ``n_steps``; at ``exit_status`` it has graduated: it goes to the sinks (when there are
any, or a sampler refills its slot) or stays, frozen, in the returned batch.

Example:
    >>> from alchemi_core.dynamics import DemoDynamics, ConvergenceHook
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> model = DemoModelWrapper()
    >>> opt = DemoDynamics(model=model, n_steps=100, dt=1.0, convergence_hook=ConvergenceHook.from_fmax(0.05))
    >>> md = DemoDynamics(model=model, n_steps=500, dt=0.5)
    >>> fused = opt + md
    >>> [code for code, _ in fused.sub_stages], fused.exit_status
    ([0, 1], 2)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from alchemi_core.dynamics import composition, runner, streams
from alchemi_core.dynamics.base import BaseDynamics
from alchemi_core.dynamics.context import StepContext
from alchemi_core.dynamics.engine import Engine
from alchemi_core.dynamics.pipeline_stage import OfRank, rank_of
from alchemi_core.dynamics.quarantine import Quarantined
from alchemi_core.dynamics.status_flow import check_status_flow
from alchemi_core.errors import ConfigurationError
from alchemi_core.tuning import CoreTuning, check_tuning

if TYPE_CHECKING:
    from alchemi_core.data import Batch
    from alchemi_core.dynamics.pipeline import DistributedPipeline
    from alchemi_core.dynamics.pipeline_rank import PipelineRank
    from alchemi_core.dynamics.sinks import DataSink


class FusedStage:
    """Sub-stages by status code on one device (see the module docstring).

    Args:
        sub_stages: ``(status_code, dynamics)`` pairs in the order systems pass through them.
        entry_status: Status of systems entering the fused stage.
        exit_status: Graduation status; -1 means ``len(sub_stages)``.
        compile_step: Capture the step as a CUDA graph on the first run on a GPU.
        compile_kwargs: Options kept for ``compile()`` (``mode``, ``fullgraph``).
        sinks: The fused stage's own sinks (after those of its sub-stages).
        hooks: Hooks that see every system.
        strict: Raise when a structure goes bad instead of quarantining it (default: True if any
            sub-stage asks for it).
        max_extent: Largest bounding-box side (Å) before atoms count as flown apart (default: the
            smallest of the sub-stages').
        tuning: The engine's per-device choices (default: the first sub-stage's that has one, else
            ``CoreTuning.for_device`` of the batch's device; see ``alchemi_core.tuning``).

    Raises:
        ConfigurationError: Status codes that lead nowhere (an entry status that is no stage's, a
            convergence target that is neither a stage nor graduation), and the like.
    """

    _stream: Any = None  # the stream of ``with stage:``
    _pipeline_rank: PipelineRank | None = None  # set by the pipeline rank running the stage

    def __init__(
        self,
        sub_stages: Sequence[tuple[int, BaseDynamics]],
        entry_status: int = 0,
        exit_status: int = -1,
        compile_step: bool = False,
        compile_kwargs: dict[str, Any] | None = None,
        sinks: Sequence[DataSink] | None = None,
        hooks: Sequence[Any] | None = None,
        strict: bool | None = None,
        max_extent: float | None = None,
        tuning: CoreTuning | None = None,
    ) -> None:
        subs = [(int(c), s) for c, s in sub_stages]
        if not subs:
            raise ConfigurationError("FusedStage needs at least one sub-stage")
        for code, stage in subs:
            if not isinstance(stage, BaseDynamics):
                raise ConfigurationError(f"sub-stage {code} is a {type(stage).__name__}, not a BaseDynamics")
        codes = [c for c, _ in subs]
        if len(set(codes)) != len(codes):
            raise ConfigurationError(f"sub-stage status codes must be distinct, got {codes}")
        if sum(1 for _, s in subs if s.sampler is not None) > 1:
            raise ConfigurationError("only one sub-stage of a FusedStage may have a sampler")
        self.sub_stages: list[tuple[int, BaseDynamics]] = subs
        self.entry_status = int(entry_status)
        self.exit_status = len(subs) if int(exit_status) == -1 else int(exit_status)
        moves = []
        for i, (code, stage) in enumerate(subs):
            conv = stage.convergence_hook
            if conv is not None:
                nxt = codes[i + 1] if i + 1 < len(codes) else self.exit_status
                source = code if conv.source_status is None else conv.source_status
                moves.append((code, source, nxt if conv.target_status is None else conv.target_status, stage.name))
        check_status_flow(codes, self.entry_status, self.exit_status, moves)
        self.strict = any(s.strict for _, s in subs) if strict is None else bool(strict)
        self.max_extent = min(s.max_extent for _, s in subs) if max_extent is None else float(max_extent)
        self.compile_step = bool(compile_step)
        check_tuning("FusedStage", tuning, CoreTuning)
        self.tuning = tuning if tuning is not None else next((s.tuning for _, s in subs if s.tuning is not None), None)
        self.compile_kwargs = dict(compile_kwargs or {})
        self.own_sinks: list[DataSink] = list(sinks or [])
        self.hooks: list[Any] = list(hooks or [])
        #: What the fused stage's own hooks see: every system of any of its sub-stages.
        self.context = StepContext(self.entry_status)
        self._engine: Engine | None = None

    # ------------------------------------------------------------------ composition
    @property
    def stages(self) -> list[BaseDynamics]:
        return [s for _, s in self.sub_stages]

    @property
    def sampler(self) -> Any:
        """The sampler of the one sub-stage that has one (None: none has)."""
        return next((s.sampler for s in self.stages if s.sampler is not None), None)

    @property
    def refill_frequency(self) -> int:
        """The sampler stage's refill frequency (without one, the smallest)."""
        with_sampler = [s.refill_frequency for s in self.stages if s.sampler is not None]
        return with_sampler[0] if with_sampler else min(s.refill_frequency for s in self.stages)

    @property
    def sinks(self) -> list[DataSink]:
        """Graduation sinks in priority order: the sampler stage's, the other stages', then the
        fused stage's own (each sink once)."""
        ordered = sorted(self.stages, key=lambda s: s.sampler is None)
        out: list[DataSink] = []
        for s in ordered:
            out.extend(x for x in s.sinks if all(x is not y for y in out))
        out.extend(x for x in self.own_sinks if all(x is not y for y in out))
        return out

    # ------------------------------------------------------------------ running
    def make_engine(self) -> Engine:
        return Engine(
            self.sub_stages,
            entry_status=self.entry_status,
            exit_status=self.exit_status,
            sinks=self.sinks,
            sampler=self.sampler,
            refill_frequency=self.refill_frequency,
            graduate_on_budget=True,
            owner=self,
            hooks=self.hooks,
        )

    def run(
        self,
        batch: Batch | None = None,
        *,
        checkpoint: str | os.PathLike[str] | None = None,
        checkpoint_every: int = 0,
        resume_from: str | os.PathLike[str] | dict[str, Any] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> Batch | None:
        """Run until every system has graduated and the sampler (if any) is drained.

        Args:
            batch: The systems (None: build them from the sampler).
            checkpoint: Write a checkpoint here every ``checkpoint_every`` steps and at the end.
            resume_from: Continue the run saved in this checkpoint (same stages and sampler), a
                path or the state ``alchemi_core.dynamics.checkpoint.load`` returned.
            stop: Asked between steps (on the host); once it returns True the run ends after
                its next check, graduates written and the checkpoint (if any) saved, so that
                ``resume_from`` continues it. ``done`` tells whether the run finished.

        Returns:
            Without a sampler, the batch (graduated systems not sent to sinks stay in it, at
            ``exit_status``); with a sampler and no sinks, a batch of every finished system;
            with a sampler and sinks, None.
        """
        return runner.execute(self, self.make_engine(), batch, None, checkpoint=checkpoint,
                              checkpoint_every=checkpoint_every, resume_from=resume_from, stop=stop)

    def _attach_owner(self, engine: Engine, context: StepContext) -> None:
        self._engine = engine
        self.context = context

    @property
    def active_batch(self) -> Batch | None:
        return self._engine.state.batch if self._engine is not None else None

    @property
    def done(self) -> bool:
        """Whether the last run finished (False when ``stop`` ended it early)."""
        return self._engine is not None and bool(self._engine.state.done)

    @property
    def step_count(self) -> int:
        """Steps the run has completed (``n`` after ``n`` steps)."""
        return self._engine.state.step_count if self._engine is not None else 0

    @property
    def quarantined(self) -> list[Quarantined]:
        """Structures the current (or last) run took out because they went bad, with reasons."""
        return self._engine.quarantine_records() if self._engine is not None else []

    def step(self, batch: Batch) -> Batch:
        """One step of every sub-stage on ``batch``, as nvalchemi's ``FusedStage.step``: one shared
        model forward, each sub-stage updating only the systems of its status code, then the
        checks that are due (convergence moves systems on to the next stage's status). The batch
        is prepared on first use.
        """
        return runner.step(self, batch, self.make_engine)

    def compile(self, **kwargs: Any) -> FusedStage:
        """Capture the step as a CUDA graph when running on a GPU (see ``streams``)."""
        return streams.compile_stage(self, kwargs)

    def __enter__(self) -> FusedStage:
        return streams.enter(self)

    def __exit__(self, *exc: Any) -> None:
        streams.leave(self)

    def __add__(self, other: Any) -> FusedStage:
        return composition.build("+", self, other)

    def __or__(self, other: Any) -> DistributedPipeline:
        return composition.build("|", self, other)

    # The seed's pipeline communication methods: the stage's rank's (``pipeline_stage``).
    pipeline_rank = property(rank_of)
    send_buffer, recv_buffer = OfRank(outside=None), OfRank(outside=None)
    _prestep_sync_buffers, _complete_pending_recv, _poststep_sync_buffers = OfRank(), OfRank(), OfRank()
    _recv_to_batch, _buffer_to_batch, _batch_to_buffer = OfRank(), OfRank(), OfRank()
    _overflow_to_sinks, _drain_sinks_to_batch = OfRank(), OfRank()

    def __repr__(self) -> str:
        inner = ", ".join(f"{c}: {s!r}" for c, s in self.sub_stages)
        return f"FusedStage([{inner}], exit_status={self.exit_status})"


def fuse(left: Any, right: Any) -> Any:
    """``left + right``: one fused stage running the sub-stages of both, in order (the left
    fused stage's compile setting, sinks and hooks carry over); ``NotImplemented`` for operands
    that are not stages."""
    a, b = _sub_stages(left), _sub_stages(right)
    if a is None or b is None:
        return NotImplemented
    subs = list(enumerate(a + b))
    if isinstance(left, FusedStage):
        return FusedStage(subs, compile_step=left.compile_step, compile_kwargs=left.compile_kwargs,
                          sinks=left.own_sinks, hooks=left.hooks, tuning=left.tuning)
    return FusedStage(subs)


def _sub_stages(stage: Any) -> list[BaseDynamics] | None:
    if isinstance(stage, FusedStage):
        return stage.stages
    return [stage] if isinstance(stage, BaseDynamics) else None


composition.register("+", fuse)
