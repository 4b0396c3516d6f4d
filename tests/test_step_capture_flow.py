"""The order of work when the step is captured (``StepLoop._graph_step``), on the CPU.

A stand-in for CUDA graphs records by running the step and putting the batch back (a capture
executes nothing) and replays by running it. What is checked is the control flow: the first
capture of a kind of step runs the step eagerly first, a later one records at once and replays
for the step itself, a failed recording falls back to the warmed-up capture, and in every case
the step happens exactly once. The GPU tests in
``tests/integration/test_graph_across_checks_gpu.py`` check the same with real graphs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from alchemi_core.dynamics import DemoDynamics, step
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import make_batch


@contextlib.contextmanager
def _put_back(batch: Any) -> Iterator[None]:
    """Every field of ``batch`` as it was before the block, after it."""
    held = {k: v.clone() for k, v in batch._store.items()}
    try:
        yield
    finally:
        for k, v in held.items():
            batch._store[k].copy_(v)


class _Graph:
    def __init__(self, record: Any) -> None:
        self._record = record

    def replay(self) -> None:
        self._record()


class _StandIn:
    """CUDA graphs, streams and the memory hooks of ``alchemi_core.dynamics.step``, on the CPU."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, engine: Any) -> None:
        self.engine = engine
        self.recordings = 0
        self.fail_next = False
        self.eager_cores = 0
        self._recording = False
        stream = type("Stream", (), {"wait_stream": lambda self, other: None})()
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: stream)
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(step, "side_stream", lambda held, index: stream)
        monkeypatch.setattr(step, "gpu_index", lambda device: 0)
        monkeypatch.setattr(step, "_holds_much_memory", lambda device: False)
        monkeypatch.setattr(step, "_release_cached_memory", lambda device: None)
        monkeypatch.setattr(step, "capture_graph", self.capture_graph)
        core = step.StepLoop._core

        def counted(loop: Any, k: int, hooks: bool) -> None:
            if not self._recording:
                self.eager_cores += 1
            core(loop, k, hooks)

        monkeypatch.setattr(step.StepLoop, "_core", counted)

    def capture_graph(self, record: Any, stream: Any, replaces: Any = None) -> tuple[_Graph, None]:
        self.recordings += 1
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("operation not permitted when stream is capturing")
        self._recording = True
        try:
            with _put_back(self.engine.batch):
                record()  # a capture records without executing
        finally:
            self._recording = False

        def replay() -> None:
            self._recording = True  # a replay is not an eager step
            try:
                record()
            finally:
                self._recording = False

        return _Graph(replay), None


def _engine() -> Any:
    dyn = DemoDynamics(model=DemoModelWrapper(), n_steps=2, dt=0.5)
    dyn.run(make_batch([3, 4], dtype=torch.float64))
    return dyn._engine


def _after_eager_steps(engine: Any, steps: int) -> torch.Tensor:
    with _put_back(engine.batch):
        for i in range(steps):
            engine._core(engine.step_count + i, False)
        return engine.batch.positions.clone()


def _prepared(monkeypatch: pytest.MonkeyPatch, warm_up_every: bool, steps: int) -> tuple[Any, torch.Tensor, _StandIn]:
    """An engine after a 2-step run, its positions after ``steps`` more eager steps, and the
    stand-in (no kind of step captured before in this process)."""
    monkeypatch.setattr(step, "_captured_kinds", set())
    monkeypatch.setattr(step, "WARM_UP_EVERY_CAPTURE", warm_up_every)
    engine = _engine()
    expected = _after_eager_steps(engine, steps)
    return engine, expected, _StandIn(monkeypatch, engine)


def _capture_anew(engine: Any, k: int) -> None:
    engine._graph_key = -1  # as after a refill: the set of systems changed
    engine._graph_step(k)


def test_only_the_first_capture_of_a_kind_runs_the_step_eagerly(monkeypatch) -> None:
    engine, expected, fake = _prepared(monkeypatch, warm_up_every=False, steps=3)
    _capture_anew(engine, 2)
    assert (fake.eager_cores, fake.recordings) == (1, 1)
    engine._graph_step(3)  # the same systems: a replay
    assert (fake.eager_cores, fake.recordings) == (1, 1)
    _capture_anew(engine, 4)
    assert (fake.eager_cores, fake.recordings) == (1, 2)  # recorded at once, replayed for the step
    assert engine.graph_captures == 2 and engine.direct_capture_failures == 0
    torch.testing.assert_close(engine.batch.positions, expected, rtol=0, atol=0)


def test_a_failed_recording_is_warmed_up_and_recorded_again(monkeypatch) -> None:
    engine, expected, fake = _prepared(monkeypatch, warm_up_every=False, steps=2)
    _capture_anew(engine, 2)
    version = engine.mask_version
    fake.fail_next = True
    _capture_anew(engine, 3)
    assert engine.direct_capture_failures == 1
    assert engine.mask_version != version  # what was cached during the failed recording is stale
    assert (fake.eager_cores, fake.recordings) == (2, 3)
    torch.testing.assert_close(engine.batch.positions, expected, rtol=0, atol=0)


def test_with_the_switch_on_every_capture_runs_the_step_eagerly(monkeypatch) -> None:
    engine, _, fake = _prepared(monkeypatch, warm_up_every=True, steps=0)
    _capture_anew(engine, 2)
    _capture_anew(engine, 3)
    assert (fake.eager_cores, fake.recordings) == (2, 2)
