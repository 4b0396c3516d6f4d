"""Pipelines on GPUs: comm:nccl between GPUs (one per rank), and comm:gloo moving CUDA batches
through host memory. Skipped without CUDA; the NCCL tests need at least two GPUs.

On the GPU machine::

    ALCHEMI_STRICT_PLUGINS=1 python -m pytest -q -p no:cacheprovider --import-mode=importlib \\
        tests/integration/test_pipeline_nccl.py
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from alchemi_core.dynamics.base import COMM_MODES
from alchemi_core.testing.contracts import CommBackendContract

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.multiprocess, pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU")]
multi_gpu = pytest.mark.skipif(GPUS < 2, reason="NCCL needs one GPU per rank: at least two")

SCENARIOS = Path(__file__).with_name("pipeline_scenarios.py")
_spec = importlib.util.spec_from_file_location("pipeline_scenarios", SCENARIOS)
assert _spec is not None and _spec.loader is not None
scen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scen)


@pytest.fixture(scope="module")
def pool() -> Iterator[Any]:
    from alchemi_nccl.spawn import RankPool

    with RankPool(min(3, max(GPUS, 2))) as p:
        yield p


def assert_close_per_system(sink: dict[str, Any], reference: Any) -> None:
    """GPU sums run in another order than the CPU reference's: equal to float64 round-off."""
    ref = scen.as_arrays(scen.by_system_id(reference))
    assert sorted(sink["arrival_ids"]) == list(range(len(scen.SIZES)))
    for k in ("atomic_numbers", "frozen", "tag", "neighbor_list", "system_id", "__num_nodes"):
        assert np.array_equal(sink["fields"][k], ref[k]), k
    for k in ("positions", "velocities", "forces", "charges", "dipole"):
        np.testing.assert_allclose(sink["fields"][k], ref[k], rtol=1e-9, atol=1e-9, err_msg=k)


@multi_gpu
class TestNcclContract(CommBackendContract):
    @pytest.fixture(autouse=True)
    def _use_pool(self, pool: Any) -> None:
        self.pool = pool

    def run_group(self, world_size: int, fn: Callable[[Any], Any]) -> list[Any]:
        if world_size > min(GPUS, self.pool.size):
            pytest.skip(f"needs {world_size} GPUs")
        return self.pool.run(world_size, fn, "comm:nccl", timeout_s=120.0)


@multi_gpu
@pytest.mark.parametrize("mode", COMM_MODES)
def test_nccl_chain_matches_fused_stages(pool: Any, mode: str) -> None:
    n = min(3, GPUS)
    results = pool.run(n, (str(SCENARIOS), "chain"), "comm:nccl", timeout_s=120.0,
                       n_stages=n, mode=mode, buffer=True, with_sampler=False, device=None)
    for r in results:
        assert r["entered"] == r["left"] == len(scen.SIZES)
    assert results[0]["held_back"] > 0
    assert_close_per_system(results[-1]["sink"], scen.fused_reference(n, False))


def test_gloo_moves_cuda_batches_through_host_memory(pool: Any) -> None:
    results = pool.run(2, (str(SCENARIOS), "chain"), "comm:gloo", timeout_s=120.0,
                       n_stages=2, mode="fully_async", buffer=True, with_sampler=True, device="cuda:0")
    assert_close_per_system(results[-1]["sink"], scen.fused_reference(2, True))


@multi_gpu
@pytest.mark.parametrize("fail_rank", [0, 1])
def test_nccl_stage_that_raises_stops_every_rank(fail_rank: int) -> None:
    """NCCL cannot see a dead peer; the failure record in the store (polled while transfers are
    in flight) and the error frame stop the other rank within seconds, not at the timeout."""
    from alchemi_nccl.spawn import launch_script

    outcomes = launch_script(str(SCENARIOS), 2, ["fail", "--fail-rank", str(fail_rank), "--stages", "2",
                                                 "--backend", "comm:nccl", "--device", "auto", "--timeout", "60"],
                             timeout_s=240)
    failed_at = float(next(ln for ln in outcomes[fail_rank].output.splitlines() if ln.startswith("FAIL_AT")).split()[1])
    for o in outcomes:
        assert o.returncode == 3, o.output[-3000:]
        line = next(ln for ln in o.output.splitlines() if ln.startswith("EXIT_ERROR"))
        assert float(line.split()[1]) - failed_at < 15.0, line
        assert "injected failure in the stage" in line
