"""Running an engine for a user: streams, once-per-run hooks, plugin lifecycle calls, results.

A stage's ``run`` calls :func:`execute` with an engine of its own (:func:`single_engine` for a
single stage), its ``step`` calls :func:`step`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch

from alchemi_core.data import Batch
from alchemi_core.dynamics import checkpoint as ckpt
from alchemi_core.dynamics.columns import restore_system_columns
from alchemi_core.dynamics.engine import Engine
from alchemi_core.dynamics.quarantine import warn_quarantined

if TYPE_CHECKING:
    from alchemi_core.dynamics.base import BaseDynamics


def single_engine(stage: BaseDynamics) -> Engine:
    """An engine with ``stage`` alone (what ``stage.run()`` and ``stage.step()`` use)."""
    return Engine(
        [(0, stage)],
        entry_status=0,
        exit_status=1,
        sinks=stage.sinks,
        sampler=stage.sampler,
        refill_frequency=stage.refill_frequency,
        graduate_on_budget=stage.sampler is not None,
        owner=stage,
    )


def step(stage: Any, batch: Batch, make_engine: Callable[[], Engine]) -> Batch:
    """``stage.step(batch)``: one step on ``batch``, with an engine from ``make_engine`` that
    prepares it on first use."""
    engine = stage._engine
    if engine is None or engine.state.batch is not batch or engine.state.owner is not stage:
        engine = make_engine()
        engine.prepare(batch)
        stage._engine = engine
    with engine.stream_context(stage._stream):
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
    on_stream = stream is not None and (batch is None or batch.device.type == "cuda")
    try:
        with torch.cuda.stream(stream) if on_stream else nullcontext():
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
