"""On a GPU: writes from device batches, the asynchronous copy that never blocks the host, and
datasets that load onto the device. Skipped without CUDA."""

from __future__ import annotations

import time

import pytest
import torch
from zarr_test_helpers import assert_matches_id, batch_for

from alchemi_core.data.datapipes import Dataset
from alchemi_core.testing import make_batch
from alchemi_core.testing.contracts import SinkContract, assert_same_systems
from alchemi_zarr import AtomicDataZarrReader, ZarrData

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


class TestZarrDataFromCuda(SinkContract):
    device = "cuda"

    @pytest.fixture(autouse=True)
    def _tmp(self, tmp_path):
        self.root = tmp_path

    def make_sink(self, capacity):
        return ZarrData(str(self.root / f"cuda-{capacity}-{id(object())}.zarr"), capacity=capacity)

    def reopen(self, sink):
        return ZarrData(sink.store.where, capacity=sink.capacity, asynchronous=sink.asynchronous)


class TestAsynchronousZarrDataFromCuda(TestZarrDataFromCuda):
    def make_sink(self, capacity):
        return ZarrData(str(self.root / f"cuda-async-{capacity}-{id(object())}.zarr"), capacity=capacity,
                        asynchronous=True)


def test_asynchronous_write_does_not_wait_for_the_gpu(tmp_path):
    """write() with no mask enqueues the copy behind running kernels and returns at once."""
    sink = ZarrData(str(tmp_path / "overlap.zarr"), asynchronous=True)
    batch = make_batch([30] * 64, edges=True, extras=True).to("cuda")
    sink.write(batch)  # warm-up: pinned buffers, the first zarr writes
    sink.flush()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e8))  # keeps the GPU busy for ~0.1-0.2 s
    start = time.perf_counter()
    sink.write(batch)
    returned = time.perf_counter() - start
    torch.cuda.synchronize()
    busy = time.perf_counter() - start
    sink.close()
    assert returned < 0.25 * busy, (returned, busy)
    assert len(AtomicDataZarrReader(str(tmp_path / "overlap.zarr"))) == 128


@pytest.mark.parametrize("copy_stream", [False, True], ids=["current-stream", "copy-stream"])
def test_asynchronous_writes_keep_the_values_of_their_moment(tmp_path, copy_stream):
    """The device batch changes right after each write; every stored copy is the one written, with
    the host copies on the current stream or on a stream of their own (``ZarrTuning.copy_stream``)."""
    from alchemi_zarr.tuning import ZarrTuning

    path = str(tmp_path / "moments.zarr")
    sink = ZarrData(path, asynchronous=True, max_pending=4, tuning=ZarrTuning(copy_stream=copy_stream))
    batch = batch_for(list(range(32))).to("cuda")
    start = batch.positions.clone()
    heavy = torch.randn(2048, 2048, device="cuda")
    for _step in range(1, 21):
        for _ in range(3):
            heavy = heavy @ heavy / 2048.0  # queue work ahead of the copy
        batch.positions.add_(1.0)
        sink.write(batch)
    batch.positions.add_(1000.0)
    sink.close()
    stored = ZarrData(path).read()
    assert stored.num_graphs == 32 * 20
    for step in range(1, 21):
        got = stored.index_select(list(range(32 * (step - 1), 32 * step)))
        torch.testing.assert_close(got.positions, (start + step).cpu())


def test_dataset_puts_structures_on_the_gpu(tmp_path):
    path = str(tmp_path / "dataset.zarr")
    ZarrData(path).write(batch_for(list(range(20))).to("cuda"))
    dataset = Dataset(AtomicDataZarrReader(path), device="cuda")
    data = dataset[7]
    assert data.positions.is_cuda and data.atomic_numbers.dtype == torch.int64
    assert_matches_id(data.to("cpu"))
    gpu_batch = AtomicDataZarrReader(path).read_batch(0, 20, device="cuda")
    assert gpu_batch.device.type == "cuda"
    assert_same_systems(batch_for(list(range(20))), gpu_batch.to("cpu"))
