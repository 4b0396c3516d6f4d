"""Shared test helpers: unique in-memory stores and structures whose content follows from an id."""

from __future__ import annotations

import uuid

import torch

from alchemi_core.data import AtomicData, Batch


def memory_url(tag: str = "t") -> str:
    """A fresh ``memory://`` URL (fsspec's memory filesystem is shared by the whole process)."""
    return f"memory://alchemi-test-{tag}-{uuid.uuid4().hex}"


def structure_for(system_id: int, dtype: torch.dtype = torch.float64) -> AtomicData:
    """A structure fully determined by ``system_id``: its size, elements, positions, a ring
    neighbour list, energy and forces, so any reader can check a record against its id."""
    g = torch.Generator().manual_seed(1000 + system_id)
    n = 2 + system_id % 7
    i = torch.arange(n)
    return AtomicData(
        atomic_numbers=torch.randint(1, 30, (n,), generator=g),
        positions=torch.randn(n, 3, generator=g, dtype=dtype),
        cell=torch.eye(3, dtype=dtype) * (5.0 + system_id % 3),
        pbc=torch.tensor([True, system_id % 2 == 0, False]),
        neighbor_list=torch.stack([i, (i + 1) % n], dim=1),
        energy=torch.randn(1, 1, generator=g, dtype=dtype),
        forces=torch.randn(n, 3, generator=g, dtype=dtype),
        system_id=torch.tensor([system_id]),
    )


def batch_for(system_ids: list[int]) -> Batch:
    return Batch.from_data_list([structure_for(i) for i in system_ids])


def assert_matches_id(data: AtomicData) -> None:
    """``data`` holds exactly what :func:`structure_for` makes for its ``system_id``."""
    sid = int(data.system_id.reshape(-1)[0])
    expected = structure_for(sid)
    assert sorted(data.keys()) == sorted(expected.keys()), sid
    for k in expected.keys():
        a, b = getattr(data, k), getattr(expected, k)
        assert a.dtype == b.dtype and torch.equal(a, b), f"system {sid}: field {k} differs"


def write_moving(sink, writes: int, shift: float = 100.0) -> None:
    """Write ``batch_for([0, 1, 2])`` ``writes`` times, adding 3 to its ``system_id`` and
    ``shift`` to its positions after each write, as dynamics change a batch after a snapshot
    (check with :func:`assert_moving_writes_kept_their_moment`)."""
    batch = batch_for([0, 1, 2])
    for _ in range(writes):
        sink.write(batch)
        batch.system_id.add_(3)
        batch.positions.add_(shift)


def assert_moving_writes_kept_their_moment(stored: Batch, writes: int, shift: float = 100.0) -> None:
    """``stored`` holds ``writes`` writes of ``batch_for([0, 1, 2])``, between which the test
    added 3 to ``system_id`` and ``shift`` to the positions: each write must hold the batch as
    it was when written, every field intact."""
    from alchemi_core.testing.contracts import assert_same_systems

    assert stored.system_id.tolist() == list(range(3 * writes))
    original = batch_for([0, 1, 2])
    for step in range(writes):
        written = stored.index_select(list(range(3 * step, 3 * step + 3)))
        torch.testing.assert_close(written.positions, original.positions + shift * step)
        written.system_id.copy_(original.system_id)
        written.positions.copy_(original.positions)
        assert_same_systems(original, written)  # every other field as written
