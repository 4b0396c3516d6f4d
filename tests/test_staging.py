"""HostStaging: host buffers for device-to-host copies, allocated once and reused."""

from __future__ import annotations

import threading

import pytest
import torch

from alchemi_core.data.staging import HostStaging


def test_a_slot_reuses_its_buffer_and_grows_only_for_larger_tensors():
    staging = HostStaging(slots=1)
    slot = staging.acquire()
    first = slot.buffer("positions", torch.zeros(10, 3))
    assert first.shape == (10, 3) and first.dtype == torch.float32
    again = slot.buffer("positions", torch.zeros(6, 3))  # smaller: the same memory
    assert again.data_ptr() == first.data_ptr() and again.shape == (6, 3)
    assert slot.buffer("positions", torch.zeros(20, 3, dtype=torch.float64)).data_ptr() != first.data_ptr()
    assert slot.nbytes >= 20 * 3 * 8
    ids = slot.buffer("system_id", torch.arange(4))  # another field: its own buffer
    ids.copy_(torch.arange(4))
    assert ids.tolist() == [0, 1, 2, 3]
    staging.release(slot)


def test_buffers_of_different_fields_do_not_overlap():
    slot = HostStaging(slots=1).acquire()
    a = slot.buffer("a", torch.zeros(8))
    b = slot.buffer("b", torch.zeros(8))
    a.fill_(1.0)
    b.fill_(2.0)
    assert a.tolist() == [1.0] * 8 and b.tolist() == [2.0] * 8


def test_acquire_waits_while_every_slot_is_in_use():
    staging = HostStaging(slots=2)
    taken = [staging.acquire(), staging.acquire()]
    assert staging.free == 0
    got = []
    waiter = threading.Thread(target=lambda: got.append(staging.acquire()))
    waiter.start()
    waiter.join(timeout=0.2)
    assert waiter.is_alive() and not got  # blocked: back-pressure, no new memory
    staging.release(taken[1])
    waiter.join(timeout=5)
    assert got == [taken[1]]  # the slot given back, with its buffers


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_buffers_for_gpu_tensors_are_pinned():
    slot = HostStaging(slots=1).acquire()
    assert slot.buffer("x", torch.zeros(5, device="cuda")).is_pinned()
    assert not slot.buffer("y", torch.zeros(5)).is_pinned()
