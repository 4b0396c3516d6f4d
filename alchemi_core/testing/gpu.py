"""Helpers for tests that run on a CUDA device: host synchronisations, graph capture, allocations."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def no_host_sync() -> Iterator[None]:
    """Inside the block, any CUDA call that synchronises with the host raises (torch's sync
    debug mode); the work queued before it is finished first, so only the block is judged.

    Example:
        >>> with no_host_sync():  # doctest: +SKIP
        ...     dynamics.step(batch)
    """
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def check_syncs(engine: Any, k: int) -> list[str]:
    """The messages of torch's sync debug mode for each host synchronisation ``engine.check(k)``
    makes (work queued before it is finished first), and one per wait on a CUDA event (which
    the debug mode does not see; the check's own read-back waits on one).

    Example:
        >>> assert len(check_syncs(engine, 1)) == 1  # doctest: +SKIP
    """
    import warnings

    torch.cuda.synchronize()
    waits: list[str] = []
    plain = torch.cuda.Event.synchronize

    def waited(event: Any) -> None:
        waits.append("waited on a CUDA event")
        plain(event)

    torch.cuda.Event.synchronize = waited
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            engine.check(k)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            torch.cuda.Event.synchronize = plain
    # (The debug mode also warns, once, that it is a prototype: that warning is not a sync.)
    return [str(w.message) for w in seen if "called a synchronizing CUDA operation" in str(w.message)] + waits


def langevin(model: Any, steps: int) -> Any:
    """The Langevin stage of these checks (300 K, 1 fs, friction 0.01/fs, seed 0; needs
    alchemi-integrators)."""
    from alchemi_core import registry

    return registry.build("integrator:langevin", model=model, n_steps=steps, dt=1.0, temperature=300.0,
                          friction=0.01, initial_temperature=300.0, random_seed=0)


def eager_and_captured(model: Any, batch: Any, steps: int = 30) -> tuple[Any, Any, int]:
    """``(eager, captured, captures)``: copies of ``batch`` after ``steps`` Langevin steps run
    eagerly and with ``compile()`` (on a GPU: a CUDA graph replayed), and how many graphs the
    compiled run captured. Same seed, so the two should agree to rounding.

    Example:
        >>> eager, graphed, captures = eager_and_captured(model, batch)  # doctest: +SKIP
        >>> torch.testing.assert_close(graphed.positions, eager.positions)  # doctest: +SKIP
    """
    eager, graphed = batch.clone(), batch.clone()
    langevin(model, steps).run(eager)
    stage = langevin(model, steps).compile()
    with stage:
        stage.run(graphed)
    return eager, graphed, int(stage._engine.state.graph_captures)


def step_allocations(stage: Any, batch: Any, steps: int = 20) -> tuple[int, int]:
    """``(allocations, segments)`` the caching allocator made during ``steps`` steps of
    ``stage`` after five warm-up steps on ``batch`` (a GPU batch): blocks handed out, and
    device memory newly taken from the driver. (Three steps after the warm-up run: the first
    step after a run captures its graph again, which is not a step's cost.)

    Example:
        >>> step_allocations(stage.compile(), batch)  # doctest: +SKIP
        (0, 0)
    """
    stage.run(batch, n_steps=5)
    engine = stage._engine
    for _ in range(3):
        engine.step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    for _ in range(steps):
        engine.step()
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    return (after["allocation.all.allocated"] - before["allocation.all.allocated"],
            after["segment.all.allocated"] - before["segment.all.allocated"])
