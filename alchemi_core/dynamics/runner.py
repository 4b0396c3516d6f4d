"""Running an engine for a user: streams, once-per-run hooks, plugin lifecycle calls, results.

:class:`StageRun` gives a single stage (``BaseDynamics``) its ``run`` and ``step``; a fused
stage builds its own engine and calls :func:`execute` the same way.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from alchemi_core.data import Batch
from alchemi_core.dynamics import checkpoint as ckpt
from alchemi_core.dynamics.columns import restore_system_columns
from alchemi_core.dynamics.engine import Engine
from alchemi_core.dynamics.quarantine import warn_quarantined

if TYPE_CHECKING:
    from alchemi_core.dynamics.sampler import SizeAwareSampler
    from alchemi_core.dynamics.sinks import DataSink


class StageRun:
    """``run()`` and ``step()`` of a single stage: an engine with this stage alone."""

    n_steps: int
    sinks: list[DataSink]
    sampler: SizeAwareSampler | None
    refill_frequency: int
    _engine: Engine | None
    _stream: Any = None

    def _make_engine(self) -> Engine:
        return Engine(
            [(0, self)],  # type: ignore[list-item]  # only BaseDynamics mixes StageRun in
            entry_status=0,
            exit_status=1,
            sinks=self.sinks,
            sampler=self.sampler,
            refill_frequency=self.refill_frequency,
            graduate_on_budget=self.sampler is not None,
            owner=self,
        )

    def run(
        self,
        batch: Batch | None = None,
        n_steps: int | None = None,
        *,
        checkpoint: str | os.PathLike[str] | None = None,
        checkpoint_every: int = 0,
        resume_from: str | os.PathLike[str] | dict[str, Any] | None = None,
    ) -> Batch | None:
        """Integrate ``batch`` in place (or stream from the sampler) and return it.

        Without a sampler, runs ``n_steps`` steps (or until every system converged). With one,
        runs until the dataset is drained: each system gets ``n_steps`` steps or converges, then
        goes to the sinks. Returns the batch; with a sampler and no sinks, a batch of every
        finished system; with a sampler and sinks, None (the results are in the sinks).

        Args:
            checkpoint: Write a checkpoint here every ``checkpoint_every`` steps and at the end
                (see ``alchemi_core.dynamics.checkpoint``).
            resume_from: Continue the run saved in this checkpoint (same stages, same sampler), a
                path or the state ``alchemi_core.dynamics.checkpoint.load`` returned;
                the result is the one the uninterrupted run would give.
        """
        engine = self._make_engine()
        steps = self.n_steps if n_steps is None else int(n_steps)
        return execute(
            self, engine, batch, None if self.sampler is not None else steps,
            checkpoint=checkpoint, checkpoint_every=checkpoint_every, resume_from=resume_from,
        )

    def step(self, batch: Batch) -> Batch:
        """One step of this stage on ``batch`` (prepares it on first use)."""
        engine = self._engine
        if engine is None or engine.state.batch is not batch or engine.state.owner is not self:
            engine = self._make_engine()
            engine.prepare(batch)
            self._engine = engine
        with engine.stream_context(self._stream):
            engine.step()
        return batch


def execute(
    owner: Any,
    engine: Engine,
    batch: Batch | None,
    max_steps: int | None,
    checkpoint: Any = None,
    checkpoint_every: int = 0,
    resume_from: Any = None,
    stop: Any = None,
) -> Batch | None:
    """Prepare ``batch`` (or resume a checkpoint), step ``engine`` until it is done (or ``stop()``
    says so, see ``Engine.run``), and return the run's result.

    The plugin lifecycle hooks (``alchemi_run_start``/``_end``/``_error``) run here, once; the
    per-step path never goes through pluggy.
    """
    from alchemi_core.registry import manager

    pm = manager()
    owner._engine = engine
    stream = getattr(owner, "_stream", None)
    try:
        if stream is not None and (batch is None or batch.device.type == "cuda"):
            import torch

            with torch.cuda.stream(stream):
                return _execute(owner, engine, batch, max_steps, pm, checkpoint, checkpoint_every, resume_from, stop)
        return _execute(owner, engine, batch, max_steps, pm, checkpoint, checkpoint_every, resume_from, stop)
    except BaseException as exc:
        pm.lifecycle("alchemi_run_error", run=owner, error=exc)
        raise


def _execute(
    owner: Any, engine: Engine, batch: Batch | None, max_steps: int | None, pm: Any,
    checkpoint: Any, checkpoint_every: int, resume_from: Any, stop: Any = None,
) -> Batch | None:
    resume = None
    if isinstance(resume_from, dict):  # a state from ckpt.load (e.g. with allow_unverified=True)
        resume = resume_from
        ckpt.check_consistent(resume, "the checkpoint state given as resume_from", "it was loaded by the caller")
    elif resume_from is not None:
        resume = ckpt.load(resume_from)
    engine.prepare(batch, resume=resume)
    pm.lifecycle("alchemi_run_start", run=owner)
    engine.start_hooks()
    try:
        engine.run(max_steps, checkpoint=checkpoint, checkpoint_every=checkpoint_every, stop=stop)
    finally:
        # A finished run's CUDA graphs (and the stages' per-run caches) go now: a loop of runs
        # (or a larger batch next) would otherwise hold every earlier run's graph memory until the
        # stage itself is freed. The next run captures its own.
        engine.release_run()
        engine.end_hooks()
    if engine.state.batch is not None:
        restore_system_columns(engine.state.batch, engine.state.user_shapes)
    # Once per run, at the user's run() call (this frame, execute, run, the caller).
    warn_quarantined(engine.quarantine_records(), stacklevel=4)
    result = result_of(engine)
    pm.lifecycle("alchemi_run_end", run=owner, result=result)
    return result


def result_of(engine: Engine) -> Batch | None:
    """What ``run()`` returns: the batch; with a sampler, the finished systems (no sinks given)
    or None (they are in the sinks)."""
    if engine.state.sampler is None:
        return engine.state.batch
    if engine.state.sinks:
        return None
    held = engine.state.host_results
    if held is None or len(held) == 0:
        return None
    return held.drain()
