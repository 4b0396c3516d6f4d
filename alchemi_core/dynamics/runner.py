"""Running an engine for a user: streams, once-per-run hooks, plugin lifecycle calls, results."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from alchemi_core.data import Batch

if TYPE_CHECKING:
    from alchemi_core.dynamics.engine import Engine


def execute(
    owner: Any,
    engine: Engine,
    batch: Batch | None,
    max_steps: int | None,
    checkpoint: Any = None,
    checkpoint_every: int = 0,
    resume_from: Any = None,
) -> Batch | None:
    """Prepare ``batch`` (or resume a checkpoint), step ``engine`` until it is done, and return
    the run's result.

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
                return _execute(owner, engine, batch, max_steps, pm, checkpoint, checkpoint_every, resume_from)
        return _execute(owner, engine, batch, max_steps, pm, checkpoint, checkpoint_every, resume_from)
    except BaseException as exc:
        pm.lifecycle("alchemi_run_error", run=owner, error=exc)
        raise


def _execute(
    owner: Any, engine: Engine, batch: Batch | None, max_steps: int | None, pm: Any,
    checkpoint: Any, checkpoint_every: int, resume_from: Any,
) -> Batch | None:
    resume = None
    if resume_from is not None:
        from alchemi_core.dynamics.checkpoint import load

        resume = load(resume_from)
    engine.prepare(batch, resume=resume)
    pm.lifecycle("alchemi_run_start", run=owner)
    engine.start_hooks()
    try:
        engine.run(max_steps, checkpoint=checkpoint, checkpoint_every=checkpoint_every)
    finally:
        engine.end_hooks()
    result = result_of(engine)
    pm.lifecycle("alchemi_run_end", run=owner, result=result)
    return result


def result_of(engine: Engine) -> Batch | None:
    """What ``run()`` returns: the batch; with a sampler, the finished systems (no sinks given)
    or None (they are in the sinks)."""
    if engine.sampler is None:
        return engine.batch
    if engine.sinks:
        return None
    held = engine.host_results
    if held is None or len(held) == 0:
        return None
    return held.drain()
