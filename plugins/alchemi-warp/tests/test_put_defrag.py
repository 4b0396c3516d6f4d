"""Batch.put and Batch.defrag through the Warp ops leave every buffer bit-identical to torch.

Random batches (sizes, edges or none, every dtype the data model keeps) are copied into a
pre-allocated buffer under a random mask and the source is defragmented, once with the torch
ops and once with the Warp ops; every field's whole storage (padding rows included) must match
byte for byte, and the copied systems must be the masked ones, in order.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alchemi_core.data import Batch
from alchemi_core.data.buffer_ops import TorchBufferOps
from alchemi_core.testing import make_batch
from alchemi_core.testing.contracts import assert_same_systems
from alchemi_warp.buffer_ops import WarpBufferOps

WARP = WarpBufferOps(allow_cpu=True, every_op=True)


def storage_bytes(batch: Batch) -> dict[str, bytes]:
    return {k: batch.storage(k).contiguous().view(torch.uint8).cpu().numpy().tobytes() for k in batch.keys()}


def planted_batch(sizes, edges, dtype, device="cpu"):
    """A test batch with a NaN and a -0.0, which must travel bit for bit."""
    batch = make_batch(sizes, edges=edges, extras=True, dtype=dtype).to(device)
    batch.positions[0, 0] = float("nan")
    batch.positions[-1, 2] = -0.0
    return batch


def put_then_defrag(ops, sizes, edges, dtype, mask_bits, held, device="cpu"):
    """Run the put/defrag sequence with ``ops``; returns (destination, source)."""
    src = planted_batch(sizes, edges, dtype, device)
    dest = Batch.empty(num_systems=len(sizes) + 3, num_nodes=sum(sizes) + 20, num_edges=sum(sizes) + 20, template=src)
    if held:
        dest.put(make_batch(held, edges=edges, extras=True, dtype=dtype, system_ids=False).to(device), ops=ops)
    mask = torch.tensor(mask_bits, device=device)
    dest.put(src, mask, ops)
    src.defrag(ops=ops)
    return dest, src


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=6),
    edges=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    held=st.lists(st.integers(1, 3), max_size=2),
    data=st.data(),
)
def test_put_and_defrag_match_torch_bit_for_bit(sizes, edges, dtype, held, data):
    mask_bits = data.draw(st.lists(st.booleans(), min_size=len(sizes), max_size=len(sizes)))
    dest_t, src_t = put_then_defrag(TorchBufferOps(), sizes, edges, dtype, mask_bits, held)
    dest_w, src_w = put_then_defrag(WARP, sizes, edges, dtype, mask_bits, held)
    for a, b in ((dest_t, dest_w), (src_t, src_w)):
        assert a.num_nodes_list == b.num_nodes_list and a.num_edges_list == b.num_edges_list
        assert storage_bytes(a) == storage_bytes(b)
    # And the right systems moved: the masked ones into dest, the others stayed, in order.
    reference = planted_batch(sizes, edges, dtype)
    moved = [i for i, m in enumerate(mask_bits) if m]
    kept = [i for i, m in enumerate(mask_bits) if not m]
    assert dest_w.system_id[len(held) :].tolist() == moved
    assert src_w.system_id.tolist() == kept
    arrived = dest_w.index_select(list(range(len(held), dest_w.num_graphs)))
    assert storage_bytes(arrived) == storage_bytes(reference.index_select(moved))
    assert storage_bytes(src_w.index_select(slice(None))) == storage_bytes(reference.index_select(kept))


@pytest.mark.parametrize("edges", [False, True])
def test_every_dtype_survives_a_round_trip_through_warp(edges):
    src = make_batch([4, 2, 5], edges=edges, extras=True, dtype=torch.float64)
    before = src.index_select(slice(None))
    dest = Batch.empty(num_systems=5, num_nodes=20, num_edges=20, template=src)
    assert dest.put(src, ops=WARP) == 3
    assert dest.atomic_numbers.dtype == torch.int64 and dest.frozen.dtype == torch.bool
    assert dest.tag.dtype == torch.int32 and dest.charges.dtype == torch.float64
    assert_same_systems(before, dest)
    if edges:
        # Edge atom indices were shifted to the destination's atom offsets.
        assert dest.neighbor_list.max().item() == dest.num_nodes - 1
    dest.zero(WARP)
    assert len(dest) == 0
    assert not any(dest.storage(k).any() for k in dest.keys())


@pytest.mark.gpu
@pytest.mark.parametrize("edges", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_put_and_defrag_on_cuda_match_torch_bit_for_bit(edges, dtype):
    sizes, mask_bits, held = [5, 1, 7, 3, 2, 6], [True, False, True, True, False, False], [2, 3]
    dest_t, src_t = put_then_defrag(TorchBufferOps(), sizes, edges, dtype, mask_bits, held, "cuda")
    dest_w, src_w = put_then_defrag(WarpBufferOps(every_op=True), sizes, edges, dtype, mask_bits, held, "cuda")
    assert storage_bytes(dest_t) == storage_bytes(dest_w)
    assert storage_bytes(src_t) == storage_bytes(src_w)
    assert dest_w.system_id[len(held) :].tolist() == [0, 2, 3]
