"""When a check's measurement is captured, replayed or measured eagerly (``check_capture``).

The graph itself needs a GPU (``tests/integration/test_check_capture_gpu.py``); here a stand-in
for ``torch.cuda.CUDAGraph`` records what the policy asks of it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from alchemi_core.dynamics import check_capture
from alchemi_core.dynamics.check_capture import CheckCapture, Measurement, field_addresses
from alchemi_core.testing import make_batch


class _Graph:
    """Stands in for a CUDA graph: counts replays (the capture runs the body, as no GPU records it)."""

    made: list[_Graph] = []

    def __init__(self) -> None:
        self.replays = 0
        self.replaces: _Graph | None = None  # the graph whose memory pool it took over
        _Graph.made.append(self)

    def replay(self) -> None:
        self.replays += 1


@pytest.fixture
def fake_cuda_graphs(monkeypatch: pytest.MonkeyPatch) -> list[_Graph]:
    _Graph.made = []

    def capture_graph(record: Any, stream: Any, replaces: Any = None) -> tuple[_Graph, Any]:
        graph = _Graph()
        graph.replaces = replaces
        return graph, record()

    monkeypatch.setattr(check_capture, "capture_graph", capture_graph)
    monkeypatch.setattr(check_capture, "capture_stream", lambda index: None)
    monkeypatch.setattr(check_capture, "retire_graph", lambda graph, index: None)
    monkeypatch.setattr(check_capture.torch.cuda, "current_device", lambda: 0)
    return _Graph.made


def _measurement() -> Measurement:
    flags = torch.zeros(6, dtype=torch.bool)
    return Measurement(torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.bool), None, flags, flags[5])


def test_a_key_is_measured_eagerly_once_then_captured_then_replayed(fake_cuda_graphs: list[_Graph]) -> None:
    capture, calls = CheckCapture(), []

    def measure() -> Measurement:
        calls.append(1)
        return _measurement()

    first = capture.measure("a", measure)
    assert len(calls) == 1 and capture.captures == 0 and not fake_cuda_graphs  # seen once: eager
    second = capture.measure("a", measure)
    assert len(calls) == 2 and capture.captures == 1 and fake_cuda_graphs[0].replays == 1
    third = capture.measure("a", measure)
    assert len(calls) == 2 and fake_cuda_graphs[0].replays == 2  # replayed, not measured
    assert third is second and first is not second  # the captured outputs are the graph's
    capture.measure("b", measure)  # a new key (a refill, a field moved): eager, graph dropped
    assert len(calls) == 3 and capture.captures == 1
    capture.measure("a", measure)  # "a" again, but not twice in a row: eager
    assert len(calls) == 4 and capture.captures == 1
    capture.measure("a", measure)  # twice in a row: captured into the memory of the first graph
    assert len(calls) == 5 and capture.captures == 2
    assert fake_cuda_graphs[1].replaces is fake_cuda_graphs[0] and fake_cuda_graphs[0].replaces is None


def test_a_capture_that_fails_turns_capture_off_and_measures_eagerly(fake_cuda_graphs: list[_Graph]) -> None:
    capture, calls = CheckCapture(), []

    def measure() -> Measurement:
        calls.append(1)
        if len(calls) == 2:  # the capture: as a read-back inside a capture would
            raise RuntimeError("operation not permitted when stream is capturing")
        return _measurement()

    capture.measure("a", measure)
    with pytest.warns(RuntimeWarning, match="stream is capturing.*measured eagerly"):
        out = capture.measure("a", measure)
    assert isinstance(out, Measurement) and len(calls) == 3  # measured again, eagerly
    assert not capture.enabled and capture.captures == 0


def _address(batch: Any, name: str) -> int:
    return {n: a for n, a, _ in field_addresses(batch)}[name]


def test_release_hands_the_graphs_to_the_next_runs_captures(
    fake_cuda_graphs: list[_Graph], monkeypatch: pytest.MonkeyPatch
) -> None:
    # An ended run's measurement graph (and a replaced one not yet taken over) are never replayed
    # again: their memory pools go to capture.retire_graph, not to waste.
    retired: list[Any] = []
    monkeypatch.setattr(check_capture, "retire_graph", lambda graph, index: retired.append((graph, index)))
    capture = CheckCapture()
    for key in ("a", "a", "b"):  # "a" captured; "b" seen once: "a"'s graph is kept for its pool
        capture.measure(key, _measurement)
    capture.release()
    assert retired == [(fake_cuda_graphs[0], 0)]
    capture.release()  # nothing left
    assert len(retired) == 1


def test_field_addresses_hold_for_in_place_updates_and_change_when_a_field_moves() -> None:
    from alchemi_core.data import Batch

    full = make_batch([3, 4], dtype=torch.float64)  # no spare capacity: set_field stores the tensor
    key = field_addresses(full)
    full.positions.add_(0.1)
    assert field_addresses(full) == key
    full.set_field("system_id", torch.tensor([7, 8]))
    assert _address(full, "system_id") != dict((n, a) for n, a, _ in key)["system_id"]
    assert _address(full, "positions") == dict((n, a) for n, a, _ in key)["positions"]
    spare = Batch.empty(num_systems=4, num_nodes=20, num_edges=0, template=full)
    spare.put(full)
    held = field_addresses(spare)
    spare.set_field("system_id", torch.tensor([1, 2]))  # copied into its buffer: the graph still sees it
    assert field_addresses(spare) == held
    assert "batch_idx" in {n for n, _, _ in held}
