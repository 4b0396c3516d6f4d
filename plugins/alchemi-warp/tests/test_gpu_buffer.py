"""GPUBuffer: the sink contract, the seed's example, per-sample limits, all-or-nothing writes."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.errors import ConfigurationError
from alchemi_core.testing import make_batch
from alchemi_core.testing.contracts import SinkContract, assert_same_systems
from alchemi_warp.buffer_ops import WarpBufferOps
from alchemi_warp.gpu_buffer import GPUBuffer


class TestGPUBufferContract(SinkContract):
    device = "cpu"

    def make_sink(self, capacity):
        return GPUBuffer(capacity=capacity, max_atoms=8, max_edges=8, device=self.device)


class TestGPUBufferContractWarpKernels(TestGPUBufferContract):
    """The same contract with every copy done by the Warp kernels (on the CPU here)."""

    def make_sink(self, capacity):
        ops = WarpBufferOps(allow_cpu=True, every_op=True)
        return GPUBuffer(capacity=capacity, max_atoms=8, max_edges=8, device=self.device, ops=ops)


@pytest.mark.gpu
class TestGPUBufferContractCUDA(TestGPUBufferContract):
    device = "cuda"


def batch(sizes=(3, 5), edges=True, device="cpu"):
    return make_batch(list(sizes), edges=edges, extras=True).to(device)


def snapshot(buffer: GPUBuffer) -> dict[str, torch.Tensor]:
    assert buffer.storage is not None
    return {k: buffer.storage.storage(k).clone() for k in buffer.storage.keys()}


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
def test_seed_example(device):
    b = batch(device=device)
    buffer = GPUBuffer(capacity=100, max_atoms=50, max_edges=200, device=device)
    buffer.write(b)
    assert len(buffer) == 2
    retrieved = buffer.read()
    assert_same_systems(b, retrieved)
    assert retrieved.device == buffer.device
    assert buffer.capacity == 100 and not buffer.is_full()


@pytest.mark.parametrize("device", DEVICES)
def test_limits_are_per_sample(device):
    """capacity x max_atoms atoms in all: three systems at the per-system limit fit."""
    buffer = GPUBuffer(capacity=3, max_atoms=4, max_edges=4, device=device)
    buffer.write(batch([4, 4], device=device))
    buffer.write(batch([4], device=device))
    assert len(buffer) == 3 and buffer.is_full()
    storage = buffer.storage
    assert storage.node_capacity == 12 and storage.edge_capacity == 12 and storage.system_capacity == 3
    assert buffer.read().num_nodes_list == [4, 4, 4]


def test_first_write_allocates_once_from_the_template():
    buffer = GPUBuffer(capacity=4, max_atoms=6, max_edges=6, device="cpu")
    assert buffer.storage is None
    first = batch([2, 3])
    buffer.write(first)
    storage = buffer.storage
    assert sorted(storage.keys()) == sorted(first.keys())  # every field, not only positions
    addresses = {k: storage.storage(k).data_ptr() for k in storage.keys()}
    buffer.write(batch([1]), torch.tensor([True]))
    buffer.zero()
    buffer.write(batch([4, 1]))
    assert buffer.storage is storage
    assert {k: storage.storage(k).data_ptr() for k in storage.keys()} == addresses


def test_too_many_systems_raise_and_change_nothing():
    buffer = GPUBuffer(capacity=3, max_atoms=6, max_edges=6, device="cpu")
    buffer.write(batch([2, 3]))
    before = snapshot(buffer)
    with pytest.raises(RuntimeError, match="cannot take 2 more systems"):
        buffer.write(batch([1, 1]))
    assert len(buffer) == 2
    after = snapshot(buffer)
    assert all(torch.equal(before[k], after[k]) for k in before)
    buffer.write(batch([1, 1]), torch.tensor([False, True]))  # one still fits
    assert len(buffer) == 3


@pytest.mark.parametrize(("what", "sizes"), [("atoms", [2, 7]), ("edges", [2, 7])])
def test_oversized_system_raises_names_it_and_changes_nothing(what, sizes):
    limits = {"max_atoms": 6, "max_edges": 10} if what == "atoms" else {"max_atoms": 10, "max_edges": 6}
    buffer = GPUBuffer(capacity=10, device="cpu", **limits)
    with pytest.raises(RuntimeError, match=f"system 1 of the batch has 7 {what}"):
        buffer.write(batch(sizes))  # a ring of 7 atoms has 7 edges
    assert buffer.storage is None and len(buffer) == 0  # not even allocated
    buffer.write(batch([2]))
    before = snapshot(buffer)
    with pytest.raises(RuntimeError, match=f"max_{what}=6"):
        buffer.write(batch(sizes))
    assert len(buffer) == 1
    assert all(torch.equal(before[k], v) for k, v in snapshot(buffer).items())
    buffer.write(batch(sizes), torch.tensor([True, False]))  # the small one alone is fine
    assert len(buffer) == 2


def test_masks_record_what_was_copied_and_where():
    buffer = GPUBuffer(capacity=5, max_atoms=6, max_edges=6, device="cpu")
    buffer.write(batch([1, 2]))
    assert buffer._copied_mask.tolist() == [True, True]
    assert buffer._dest_mask.tolist() == [True, True, False, False, False]
    b = batch([3, 1, 2])
    buffer.write(b, torch.tensor([True, False, True]))
    assert buffer._copied_mask.tolist() == [True, False, True]
    assert buffer._dest_mask.tolist() == [False, False, True, True, False]
    assert buffer.read().system_id.tolist() == [0, 1, 0, 2]
    buffer.write(b, torch.zeros(3, dtype=torch.bool))
    assert not buffer._copied_mask.any() and not buffer._dest_mask.any()


@pytest.mark.parametrize(
    "mask",
    [torch.tensor([True, False, True]), torch.tensor([1, 0]), torch.tensor([[True, False]])],
    ids=["too-long", "not-bool", "2-d"],
)
def test_bad_masks_are_value_errors(mask):
    buffer = GPUBuffer(capacity=5, max_atoms=6, max_edges=6, device="cpu")
    with pytest.raises(ValueError, match=r"bool tensor of shape \[2\]"):
        buffer.write(batch([1, 2]), mask)
    assert len(buffer) == 0


def test_batches_with_other_fields_are_refused():
    buffer = GPUBuffer(capacity=5, max_atoms=6, max_edges=6, device="cpu")
    buffer.write(batch([1, 2]))
    with pytest.raises(ValueError, match="neighbor_list: buffer"):
        buffer.write(batch([1], edges=False))
    other = batch([2])
    other.positions = other.positions.double()
    with pytest.raises(ValueError, match="positions"):
        buffer.write(other)
    assert len(buffer) == 2


def test_read_is_a_copy_without_padding_and_zero_keeps_shapes():
    buffer = GPUBuffer(capacity=6, max_atoms=6, max_edges=6, device="cpu")
    buffer.write(batch([2, 3]))
    out = buffer.read()
    assert out.num_nodes == 5 and out.node_capacity == 5 and out.system_capacity == 2
    out.positions.fill_(99.0)
    assert not (buffer.read().positions == 99.0).any()
    shapes = {k: buffer.storage.storage(k).shape for k in buffer.storage.keys()}
    drained = buffer.drain()
    assert drained.num_graphs == 2 and len(buffer) == 0
    assert {k: buffer.storage.storage(k).shape for k in buffer.storage.keys()} == shapes
    assert not any(buffer.storage.storage(k).any() for k in buffer.storage.keys())
    with pytest.raises(RuntimeError, match="empty"):
        buffer.read()


def test_write_leaves_the_source_batch_as_it_was():
    buffer = GPUBuffer(capacity=5, max_atoms=6, max_edges=6, device="cpu")
    b = batch([1, 2, 3])
    before = b.index_select(slice(None))
    buffer.write(b, torch.tensor([False, True, False]))
    assert_same_systems(before, b)
    assert buffer.read().system_id.tolist() == [1]


@pytest.mark.parametrize(
    "kwargs",
    [dict(capacity=-1), dict(max_atoms=2.5), dict(max_edges=True)],
)
def test_bad_sizes_are_configuration_errors(kwargs):
    args = dict(capacity=2, max_atoms=2, max_edges=2, device="cpu") | kwargs
    with pytest.raises(ConfigurationError, match=next(iter(kwargs))):
        GPUBuffer(**args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_cuda_without_cuda_says_to_use_cpu():
    with pytest.raises(ConfigurationError, match='device="cpu"'):
        GPUBuffer(capacity=2, max_atoms=2, max_edges=2)


@pytest.mark.gpu
def test_bare_cuda_means_the_current_device_and_cpu_batches_are_moved():
    buffer = GPUBuffer(capacity=4, max_atoms=6, max_edges=6, device="cuda")
    assert buffer.device == torch.device("cuda", torch.cuda.current_device())
    b = batch([2, 3, 4])  # on the CPU
    buffer.write(b, torch.tensor([True, False, True]))
    assert buffer.storage.positions.device.type == "cuda"
    assert buffer._copied_mask.device.type == "cpu" and buffer._copied_mask.tolist() == [True, False, True]
    assert buffer._dest_mask.tolist() == [True, True, False, False]
    assert_same_systems(b.index_select([0, 2]), buffer.read().to("cpu"))
