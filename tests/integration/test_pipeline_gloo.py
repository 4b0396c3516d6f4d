"""Pipelines over gloo with real processes: every system arrives once, with the same per-system
results as the same stages fused on one rank, in every comm mode, under back-pressure.

Ranks are processes of a ``RankPool`` (started once for the module); each test joins a fresh
process group over ``comm:gloo`` and runs a scenario of ``pipeline_scenarios.py`` on every rank.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from alchemi_core.dynamics.base import COMM_MODES

pytestmark = pytest.mark.multiprocess

SCENARIOS = Path(__file__).with_name("pipeline_scenarios.py")
#: Fields compared bit for bit (integers, bools) or to float64 round-off (the rest).
FLOAT_FIELDS = ("positions", "velocities", "forces", "energy", "charges", "dipole", "shifts", "cell", "atomic_masses")
EXACT_FIELDS = ("atomic_numbers", "frozen", "tag", "neighbor_list", "pbc", "system_id", "__num_nodes", "__num_edges")


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pipeline_scenarios", SCENARIOS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


scen = _load()


@pytest.fixture(scope="module")
def pool() -> Iterator[Any]:
    from alchemi_nccl.spawn import RankPool

    with RankPool(4) as p:
        yield p


def run(pool: Any, world_size: int, name: str, **kwargs: Any) -> list[dict[str, Any]]:
    return pool.run(world_size, (str(SCENARIOS), name), "comm:gloo", timeout_s=60.0, **kwargs)


def assert_each_system_once(results: list[dict[str, Any]]) -> None:
    n = len(scen.SIZES)
    ids = results[-1]["sink"]["arrival_ids"]
    assert sorted(ids) == list(range(n)), f"the last stage's sink holds {sorted(ids)}"
    for r in results:  # no rank kept or dropped anything
        assert r["entered"] == r["left"] == n, r


def assert_same_per_system(sink: dict[str, Any], reference: Any) -> None:
    ref = scen.as_arrays(scen.by_system_id(reference))
    for k in EXACT_FIELDS:
        assert np.array_equal(sink["fields"][k], ref[k]), f"field {k!r} differs from the fused run"
        assert sink["fields"][k].dtype == ref[k].dtype, k
    for k in FLOAT_FIELDS:
        got, want = sink["fields"][k], ref[k]
        assert got.dtype == want.dtype == np.float64, k
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=f"field {k!r}")


@pytest.fixture(scope="module")
def references() -> dict[tuple[int, bool], Any]:
    return {(n, s): scen.fused_reference(n, s) for n in (2, 3, 4) for s in (False, True) if n == 2 or not s}


@pytest.mark.parametrize("n_stages", [2, 3])
@pytest.mark.parametrize("mode", COMM_MODES)
def test_chain_matches_fused_stages_under_back_pressure(pool: Any, references: Any, n_stages: int, mode: str) -> None:
    results = run(pool, n_stages, "chain", n_stages=n_stages, mode=mode, buffer=True, with_sampler=False)
    assert_each_system_once(results)
    assert results[0]["held_back"] > 0, "the tiny send buffer should have held systems back"
    assert all(r["result_is_none"] for r in results)  # results are in the last stage's sink
    assert_same_per_system(results[-1]["sink"], references[(n_stages, False)])


def test_sampler_refills_first_rank_and_overflow_stages_arrivals(pool: Any, references: Any) -> None:
    results = run(pool, 2, "chain", n_stages=2, mode="async_recv", buffer=True, with_sampler=True)
    assert_each_system_once(results)
    assert results[1]["staged"] > 0, "rank 1 (3 slots, longer budget) should have used its overflow sink"
    assert_same_per_system(results[-1]["sink"], references[(2, True)])


def test_without_buffer_config_everything_graduated_is_sent(pool: Any, references: Any) -> None:
    results = run(pool, 2, "chain", n_stages=2, mode="fully_async", buffer=False, with_sampler=False)
    assert_each_system_once(results)
    assert results[0]["held_back"] == 0
    assert_same_per_system(results[-1]["sink"], references[(2, False)])


def test_mixed_comm_modes_synchronized(pool: Any, references: Any) -> None:
    results = run(pool, 3, "mixed_modes")
    assert_each_system_once(results)
    # Synchronized: one all-reduce per pass of every rank's loop, so all stop in the same pass,
    # although the first rank has far fewer iterations of work.
    assert len({r["rounds"] for r in results}) == 1, results
    assert results[0]["iterations"] < results[0]["rounds"]
    assert_same_per_system(results[-1]["sink"], references[(3, False)])
    # The field rank 0 added mid-run went on (one schema renewal per link), values intact.
    assert [r["schema_renewals"] for r in results] == [1, 2, 1]
    fields = results[-1]["sink"]["fields"]
    np.testing.assert_array_equal(fields["spin"], fields["atomic_numbers"] * 0.5)


def test_a_raising_stage_fails_every_rank_and_the_group_can_be_rebuilt(pool: Any, references: Any) -> None:
    """The processes live on (a caller caught the error): the failing rank still aborts its
    group, so the others stop at once rather than after the 60 s timeout, and a new group in
    the same processes works."""
    from alchemi_core.errors import PipelineError

    start = time.monotonic()
    with pytest.raises(PipelineError) as info:
        run(pool, 3, "raising", fail_rank=1)
    assert time.monotonic() - start < 30.0
    report = str(info.value)
    for r in range(3):
        assert f"rank {r}:" in report
    assert report.count("injected failure in the stage") >= 3, report  # every rank names the cause
    results = run(pool, 2, "chain", n_stages=2, mode="sync", buffer=True, with_sampler=False)
    assert_same_per_system(results[-1]["sink"], references[(2, False)])


@pytest.mark.parametrize("n_stages", [2, 4])
def test_a_sender_runs_ahead_of_a_stalled_neighbour(pool: Any, references: Any, n_stages: int) -> None:
    """fully_async: while rank 1 stalls for 1.5 s at its first step, rank 0 keeps stepping and
    sending into its queue of sends in flight, and with six frames in flight finishes all of its
    work meanwhile; with a queue of one it waits for rank 1 after its first send."""
    steps_during_stall, finished_during_stall = {}, {}
    for depth in (1, 6):
        results = run(pool, n_stages, "run_ahead", n_stages=n_stages, queue_depth=depth, slow_rank=1,
                      seconds=1.5, at=(0,))
        assert_each_system_once(results)
        assert_same_per_system(results[-1]["sink"], references[(n_stages, False)])
        stall_end = results[1]["step_ends"][0]
        steps_during_stall[depth] = sum(t < stall_end for t in results[0]["step_ends"])
        finished_during_stall[depth] = results[0]["step_ends"][-1] < stall_end
        assert results[0]["max_in_flight"] == depth
    assert finished_during_stall == {1: False, 6: True}, (finished_during_stall, steps_during_stall)
    assert steps_during_stall[6] > steps_during_stall[1], steps_during_stall


def test_arrivals_wait_for_the_receivers_own_check_when_it_has_work(pool: Any, references: Any) -> None:
    """fully_async: rank 0 is slow, so rank 1's frame is often not there at its check; with
    systems to integrate it does not wait but admits the arrivals at a later check."""
    results = run(pool, 2, "run_ahead", n_stages=2, queue_depth=4, slow_rank=0, seconds=0.01, at=None)
    assert_each_system_once(results)
    assert results[1]["deferred"] > 0, results[1]
    assert_same_per_system(results[-1]["sink"], references[(2, False)])


def test_dtype_of_inputs_is_float64() -> None:
    """The comparisons above are only tight because the scenario runs in float64."""
    assert scen.structures().positions.dtype == torch.float64
