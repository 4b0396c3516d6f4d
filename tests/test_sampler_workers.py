"""``SizeAwareSampler(workers=N)``: structures built in worker processes (``build_pool``).

The structures, their order and the run's results are those of a sampler that builds them in
the engine's process; what fails to build raises where it is requested, as without workers.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from alchemi_core.data import AtomicData
from alchemi_core.dynamics import DemoDynamics, HostMemory, SizeAwareSampler
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import random_structures

SIZES = [3, 8, 5, 8, 2, 3, 5, 8, 2, 5, 3, 8, 1, 4, 6, 7, 2, 2, 9, 3] * 3


class MadeOnRequest:
    """Structures made when asked, each saying which process made it (``maker``, a system
    field); ``broken`` indices raise."""

    def __init__(self, sizes: list[int], broken: tuple[int, ...] = ()) -> None:
        self.structures = random_structures(sizes, dtype=torch.float64)
        self.broken = broken

    def __len__(self) -> int:
        return len(self.structures)

    def __getitem__(self, index: int) -> AtomicData:
        if index in self.broken:
            raise ValueError(f"structure {index} cannot be read")
        s = self.structures[index]
        return AtomicData(atomic_numbers=s.atomic_numbers.clone(), positions=s.positions.clone(),
                          cell=torch.eye(3, dtype=torch.float64) * 10.0, pbc=torch.tensor([True, True, False]),
                          maker=torch.tensor([os.getpid()]), levels={"maker": "system"})

    def get_metadata(self, index: int) -> tuple[int, int]:
        return self.structures[index].num_nodes, 0


def _drain(sampler: SizeAwareSampler, prefetch_between: bool) -> list[Any]:
    """Every batch a refill of up to 4 systems and 12 atoms takes, in order."""
    out = []
    while not sampler.exhausted:
        if prefetch_between:
            while sampler.prefetch():
                pass
        batch = sampler.request_batch(4, 12, None)
        assert batch is not None
        out.append(batch)
    return out


@pytest.mark.parametrize("prefetch_between", [False, True])
def test_workers_hand_out_the_same_structures_in_the_same_order(prefetch_between: bool) -> None:
    plain = _drain(SizeAwareSampler(MadeOnRequest(SIZES), max_atoms=12, bin_width=2), prefetch_between)
    sampler = SizeAwareSampler(MadeOnRequest(SIZES), max_atoms=12, bin_width=2, workers=2, prefetch=16)
    built = _drain(sampler, prefetch_between)
    assert [b.system_id.tolist() for b in built] == [b.system_id.tolist() for b in plain]
    for a, b in zip(built, plain, strict=True):
        for name in ("positions", "atomic_numbers", "cell", "pbc", "batch_idx"):
            assert getattr(a, name).dtype == getattr(b, name).dtype
            torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=0)
    makers = {int(m) for b in built for m in b.maker}
    assert os.getpid() not in makers and len(makers) >= 1  # made in the workers, not here
    assert {int(m) for b in plain for m in b.maker} == {os.getpid()}
    assert sampler._pool is None and sampler._ready == {}  # all handed out: the workers stopped
    assert sampler.worker_builds == len(SIZES) and (sampler.prefetched > 0) == prefetch_between


def test_a_structure_a_worker_fails_to_build_raises_where_it_is_requested() -> None:
    sampler = SizeAwareSampler(MadeOnRequest(SIZES, broken=(1,)), max_atoms=12, bin_width=2, workers=2)
    while sampler.prefetch():
        pass
    with pytest.raises(ValueError, match="structure 1 cannot be read"):
        sampler.request_batch(1, 8, None)  # index 1 is the first 8-atom structure
    batch = sampler.request_batch(1, 8, None)  # the others still come
    assert batch is not None and batch.system_id.tolist() == [3]
    sampler.close()
    assert sampler._pool is None and not any(type(v).__name__ == "Pending" for v in sampler._ready.values())


def test_an_inflight_run_with_workers_gives_the_run_without(monkeypatch: pytest.MonkeyPatch) -> None:
    from alchemi_core.dynamics import readback

    def read_with_idle_work(self: Any, flags: torch.Tensor, idle: Any = None, meanwhile: Any = None) -> list[Any]:
        out = flags.tolist()
        if meanwhile is not None:
            meanwhile()
        if idle is not None:  # as if the GPU were always busy: prefetch at every check
            while idle():
                pass
        return out

    def run(workers: int) -> Any:
        sampler = SizeAwareSampler(MadeOnRequest(SIZES), max_atoms=16, bin_width=2, workers=workers)
        sink = HostMemory(capacity=None)
        DemoDynamics(model=DemoModelWrapper(), n_steps=6, dt=0.5, sampler=sampler, sinks=[sink],
                     refill_frequency=2).run()
        return sink.read()

    plain = run(0)
    monkeypatch.setattr(readback.FlagReadBack, "read", read_with_idle_work)
    built = run(2)
    assert built.system_id.tolist() == plain.system_id.tolist() and built.num_graphs == len(SIZES)
    torch.testing.assert_close(built.positions, plain.positions, rtol=0, atol=0)
    torch.testing.assert_close(built.forces, plain.forces, rtol=0, atol=0)


def test_a_negative_number_of_workers_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="workers"):
        SizeAwareSampler(MadeOnRequest(SIZES), max_atoms=12, workers=-1)


class EdgesUnsaid(MadeOnRequest):
    """Structures with a neighbour list whose metadata says they have no edges."""

    def __getitem__(self, index: int) -> AtomicData:
        s = self.structures[index]
        pairs = torch.tensor([[0, 0]] * 3, dtype=torch.long)
        return AtomicData(atomic_numbers=s.atomic_numbers.clone(), positions=s.positions.clone(), neighbor_list=pairs)


def test_with_workers_edges_the_metadata_does_not_give_are_an_error_that_says_so() -> None:
    sampler = SizeAwareSampler(EdgesUnsaid(SIZES), max_atoms=12, max_edges=100, bin_width=2, workers=1)
    with pytest.raises(InvalidDataError, match="has 3 edges but get_metadata said 0"):
        sampler.request_batch(2, 12, 100)
    sampler.close()


class DiesOn(MadeOnRequest):
    """A dataset whose code ends the process that builds structure ``fatal``."""

    def __init__(self, sizes: list[int], fatal: int) -> None:
        super().__init__(sizes)
        self.fatal = fatal

    def __getitem__(self, index: int) -> AtomicData:
        if index == self.fatal:
            os._exit(3)  # as the kernel's out-of-memory killer would end it
        return super().__getitem__(index)


def test_a_worker_that_dies_is_an_error_that_says_what_to_do_not_a_hang() -> None:
    from alchemi_core.dynamics.build_pool import WorkerLost

    sampler = SizeAwareSampler(DiesOn(SIZES, fatal=1), max_atoms=12, bin_width=2, workers=1)
    with pytest.raises(WorkerLost, match="workers=0"):
        sampler.request_batch(2, 12, None)  # index 1 (8 atoms) is among the first taken
    sampler.close()
