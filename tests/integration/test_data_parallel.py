"""Data-parallel runs with real processes over gloo: 1, 2 and 4 ranks store the same set of
results as one process (every structure once, the same final energies), a failing or killed rank
is reported with the structures it held, and a rerun completes the store with nothing repeated.

Ranks are the processes of a ``RankPool`` (started once for the module) or, for a killed rank,
processes launched as torchrun would (``launch_script``).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from alchemi_core.parallel import MemoryResults, balanced_shards, run_data_parallel

pytestmark = pytest.mark.multiprocess

JOB = Path(__file__).with_name("data_parallel_job.py")


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("data_parallel_job", JOB)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


job = _load()


@pytest.fixture(scope="module")
def pool() -> Iterator[Any]:
    from alchemi_nccl.spawn import RankPool

    with RankPool(4) as p:
        yield p


@pytest.fixture(scope="module")
def reference() -> dict[int, tuple[float, np.ndarray]]:
    """Energy and positions per system_id from one process, no store in between."""
    results = MemoryResults()
    run_data_parallel(job.make_run_factory(), job.dataset(), results)
    return by_id(results.sink(0).read())


def by_id(batch: Any) -> dict[int, tuple[float, np.ndarray]]:
    ids = batch.system_id.reshape(-1).tolist()
    energy = batch.energy.reshape(-1).double().numpy()
    pos = [p.double().numpy() for p in batch.positions.split(batch.num_nodes_list)]
    return {i: (float(e), x) for i, e, x in zip(ids, energy, pos, strict=True)}


def stored(root: Path) -> tuple[list[int], dict[int, tuple[float, np.ndarray]]]:
    from alchemi_zarr import ShardedZarrReader

    reader = ShardedZarrReader(root)
    batch = reader.read_batch()
    return batch.system_id.reshape(-1).tolist(), by_id(batch)


def assert_same_results(root: Path, reference: dict[int, tuple[float, np.ndarray]]) -> None:
    ids, got = stored(root)
    assert sorted(ids) == list(range(len(job.SIZES))), f"the store holds {sorted(ids)}"
    for i, (energy, pos) in reference.items():
        assert got[i][0] == pytest.approx(energy, rel=1e-10, abs=1e-12), f"system {i}"
        np.testing.assert_allclose(got[i][1], pos, rtol=1e-10, atol=1e-12, err_msg=f"system {i}")


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_every_rank_count_stores_the_same_results(pool: Any, reference: Any, tmp_path: Path, world_size: int) -> None:
    root = tmp_path / "results.zarr"
    out = pool.run(world_size, (str(JOB), "job"), "comm:gloo", timeout_s=60.0, root=str(root))
    assert out[0]["complete"] and out[0]["committed"] == len(job.SIZES), out[0]
    assert all(o["ran"] == len(job.SIZES) and o["skipped"] == 0 for o in out)
    assert_same_results(root, reference)
    parts = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert parts == [f"part-{r:05d}" for r in range(world_size)]


def test_a_rank_that_raises_stops_every_rank_naming_its_structures(pool: Any, tmp_path: Path) -> None:
    root = tmp_path / "results.zarr"
    out = pool.run(2, (str(JOB), "job"), "comm:gloo", timeout_s=60.0, root=str(root), fail_rank=1, how="raise")
    assert all("error" in o for o in out), out
    assert "injected failure" in out[0]["error"] and out[0]["failed_rank"] == 1
    held = out[1]["unfinished"][1]
    assert held and f"rank 1 held {len(held)} structures" in out[0]["error"]
    ids, _ = stored(root)
    assert set(held).isdisjoint(ids)


def test_a_killed_rank_is_reported_and_a_rerun_completes_the_store(reference: Any, tmp_path: Path) -> None:
    from alchemi_nccl.spawn import launch_script

    root = tmp_path / "results.zarr"
    timeout_s = 5.0
    ranks = launch_script(str(JOB), 2, [str(root), "--fail-rank", "1", "--how", "kill", "--timeout", str(timeout_s)],
                          timeout_s=90.0)
    assert ranks[1].returncode == -9, ranks[1].output
    assert ranks[0].returncode == 3, ranks[0].output
    report = json.loads(ranks[0].output.strip().splitlines()[-1])
    assert report["failed_rank"] == 1, report
    # Rank 0 stopped within the heartbeat bound after rank 1 died (plus a beat and a poll).
    assert ranks[0].wall_s - ranks[1].wall_s < timeout_s + 5, (ranks[0].wall_s, ranks[1].wall_s)

    ids, _ = stored(root)
    assert len(ids) == len(set(ids)), "a structure was stored twice"
    shards = balanced_shards(np.array(job.SIZES), 2)
    lost = sorted(set(shards[1].tolist()) - set(ids))
    assert lost and report["unfinished"]["1"] == lost, (report, lost)
    assert f"rank 1 held {len(lost)} structures" in report["error"]
    assert set(shards[1].tolist()) & set(ids), "rank 1 had committed some structures before it died"

    # Rerun, here with one process: only the missing structures run, and the store is complete.
    summary = run_data_parallel(job.make_run_factory(), job.dataset(), job.store(str(root)))
    missing = len(job.SIZES) - len(ids)
    assert (summary.ran, summary.skipped) == (missing, len(ids))
    assert summary.complete and summary.committed == len(job.SIZES) and not summary.duplicated
    assert_same_results(root, reference)


@pytest.mark.gpu
def test_two_processes_share_one_gpu(reference: Any, tmp_path: Path) -> None:
    """On a one-GPU machine both ranks run on cuda:0 (LOCAL_RANK modulo the GPUs) over gloo."""
    import torch

    from alchemi_nccl.spawn import launch_script

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    root = tmp_path / "results.zarr"
    ranks = launch_script(str(JOB), 2, [str(root), "--timeout", "60"], timeout_s=300.0)
    for r in ranks:
        assert r.returncode == 0, r.output
    reports = [json.loads(r.output.strip().splitlines()[-1]) for r in ranks]
    assert [rep["devices"] for rep in reports] == [["cuda:0"], [f"cuda:{1 % torch.cuda.device_count()}"]]
    assert reports[0]["complete"]
    assert_same_results(root, reference)  # the reference ran on this process's device
