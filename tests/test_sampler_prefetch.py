"""``SizeAwareSampler.prefetch``: structures built ahead of their request, while a check waits for
the GPU, change nothing about which structures are handed out or what they hold."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from alchemi_core.data import AtomicData
from alchemi_core.dynamics import DemoDynamics, HostMemory, SizeAwareSampler
from alchemi_core.errors import ConfigurationError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import random_structures

SIZES = [3, 8, 5, 8, 2, 3, 5, 8, 2, 5, 3, 8]


class BuiltOnRequest:
    """A dataset that builds each structure when asked (as one reading files would), counting
    the builds; ``broken`` indices raise."""

    def __init__(self, sizes: list[int], broken: tuple[int, ...] = ()) -> None:
        self.structures = random_structures(sizes, dtype=torch.float64)
        self.broken = broken
        self.built: list[int] = []

    def __len__(self) -> int:
        return len(self.structures)

    def __getitem__(self, index: int) -> AtomicData:
        self.built.append(index)
        if index in self.broken:
            raise ValueError(f"structure {index} cannot be read")
        s = self.structures[index]
        return AtomicData(atomic_numbers=s.atomic_numbers.clone(), positions=s.positions.clone())

    def get_metadata(self, index: int) -> tuple[int, int]:
        return self.structures[index].num_nodes, 0


def _drain(sampler: SizeAwareSampler, prefetch_between: bool) -> list[tuple[int, int]]:
    """(system_id, atoms) of every structure handed out, in order, in requests of up to 9 atoms."""
    out = []
    while not sampler.exhausted:
        if prefetch_between:
            while sampler.prefetch():
                pass
        batch = sampler.request_batch(3, 9, None)  # as a refill asks
        assert batch is not None
        out.extend(zip(batch.system_id.tolist(), batch.num_nodes_list, strict=True))
    return out


def test_prefetched_structures_are_the_ones_handed_out_and_each_is_built_once() -> None:
    plain_ds, ahead_ds = BuiltOnRequest(SIZES), BuiltOnRequest(SIZES)
    plain = _drain(SizeAwareSampler(plain_ds, max_atoms=9, bin_width=2, prefetch=0), prefetch_between=True)
    sampler = SizeAwareSampler(ahead_ds, max_atoms=9, bin_width=2, prefetch=4)
    ahead = _drain(sampler, prefetch_between=True)
    assert ahead == plain and sorted(i for i, _ in ahead) == list(range(len(SIZES)))
    assert sorted(ahead_ds.built) == list(range(len(SIZES)))  # each built once, ahead or not
    assert sampler.prefetched > 0 and sampler._ready == {}
    assert plain_ds.built == [i for i, _ in plain]  # without prefetch: built when requested


def test_prefetch_builds_the_next_of_each_bin_largest_first_up_to_its_limit() -> None:
    ds = BuiltOnRequest(SIZES)
    sampler = SizeAwareSampler(ds, max_atoms=9, bin_width=2, prefetch=5)
    while sampler.prefetch():
        pass
    # Bins (atoms // 2): 8 atoms -> 4: [1, 3, 7, 11]; 5 -> 2: [2, 6, 9]; 3 and 2 -> 1: [0, 4, 5, 8, 10].
    # The first four of each bin, largest bins first, up to the limit.
    assert ds.built == [1, 3, 7, 11, 2]
    assert not sampler.prefetch() and len(ds.built) == 5
    data = sampler.request_replacement(num_atoms=8)  # another kind of request: built again
    assert data is not None and int(data.system_id.item()) == 1
    assert ds.built[-1] == 1 and (1, True) not in sampler._ready


def test_after_each_bins_first_prefetch_builds_what_refills_of_whole_batches_take() -> None:
    """Systems that entered together leave together: refills may need whole batches in a row."""
    from alchemi_core.dynamics.sampler import PREFETCH_BATCHES, PREFETCH_HEADS

    sizes = [8] * 30 + [3] * 10 + [1] * 10
    ds = BuiltOnRequest(sizes)
    sampler = SizeAwareSampler(ds, max_atoms=40, bin_width=1)
    while sampler.prefetch():
        pass
    heads = [start + j for start in (0, 30, 40) for j in range(PREFETCH_HEADS)]
    # Then best fit into PREFETCH_BATCHES batches of 40 atoms: only 8-atom structures.
    waves = list(range(PREFETCH_HEADS, PREFETCH_BATCHES * 40 // 8))
    assert ds.built == [*heads, *waves]
    batch = sampler.request_batch(5, 40, None)
    assert batch is not None and batch.system_id.tolist() == [0, 1, 2, 3, 4]
    assert ds.built == [*heads, *waves]  # all of them were ready
    assert sampler.prefetch() and ds.built[-1] == PREFETCH_BATCHES * 40 // 8  # the next one


def test_a_structure_that_fails_to_build_ahead_raises_when_it_is_requested() -> None:
    ds = BuiltOnRequest(SIZES, broken=(2,))
    sampler = SizeAwareSampler(ds, max_atoms=9, bin_width=2, prefetch=8)
    while sampler.prefetch():
        pass
    assert 2 in ds.built
    first = sampler.request_batch(1, 8, None)
    assert first is not None and first.num_nodes_list == [8]
    with pytest.raises(ValueError, match="structure 2 cannot be read"):
        sampler.request_batch(1, 5, None)


def test_prefetch_zero_builds_nothing_ahead_and_a_negative_limit_is_refused() -> None:
    ds = BuiltOnRequest(SIZES)
    sampler = SizeAwareSampler(ds, max_atoms=9, bin_width=2, prefetch=0)
    assert not sampler.prefetch() and ds.built == []
    with pytest.raises(ConfigurationError, match="prefetch"):
        SizeAwareSampler(ds, max_atoms=9, prefetch=-1)


def test_a_resumed_sampler_forgets_what_it_built_ahead() -> None:
    ds = BuiltOnRequest(SIZES)
    sampler = SizeAwareSampler(ds, max_atoms=9, bin_width=2, prefetch=6)
    while sampler.prefetch():
        pass
    state = sampler.state_dict()
    sampler.load_state_dict(state)
    assert sampler._ready == {}
    assert sorted(i for i, _ in _drain(sampler, prefetch_between=False)) == list(range(len(SIZES)))


def test_an_inflight_run_with_prefetch_gives_the_run_without(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine calls ``prefetch`` only while a GPU check waits; called at every check here
    (as if the GPU were always busy), the run's results are the same."""
    from alchemi_core.dynamics import readback

    def read_with_idle_work(self: Any, flags: torch.Tensor, idle: Any = None, meanwhile: Any = None) -> list[Any]:
        out = flags.tolist()
        if meanwhile is not None:
            meanwhile()
        if idle is not None:
            while idle():
                pass
        return out

    def run(prefetch: int) -> tuple[Any, SizeAwareSampler]:
        sampler = SizeAwareSampler(BuiltOnRequest(SIZES), max_atoms=12, bin_width=2, prefetch=prefetch)
        sink = HostMemory(capacity=None)
        DemoDynamics(model=DemoModelWrapper(), n_steps=6, dt=0.5, sampler=sampler, sinks=[sink],
                     refill_frequency=2).run()
        return sink.read(), sampler

    plain, _ = run(0)
    monkeypatch.setattr(readback.FlagReadBack, "read", read_with_idle_work)
    ahead, sampler = run(8)
    assert sampler.prefetched > 0
    assert ahead.system_id.tolist() == plain.system_id.tolist()
    torch.testing.assert_close(ahead.positions, plain.positions, rtol=0, atol=0)
