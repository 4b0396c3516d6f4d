"""The data-parallel layer in one process: shards balanced by atoms, shard datasets that carry
their ids, the agreement check, and reruns that skip what is stored (ranks as threads of an
in-process group; the multi-process tests are in tests/integration/test_data_parallel.py)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch

from alchemi_core.comm.inprocess import InProcessBackend
from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import DemoDynamics, SizeAwareSampler
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.parallel import (
    DataParallelError,
    MemoryResults,
    ShardDataset,
    balanced_shards,
    dataset_ids,
    run_data_parallel,
)
from alchemi_core.testing import random_structures


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
def test_shards_cover_every_structure_once_and_balance_atoms(world_size: int) -> None:
    atoms = np.random.default_rng(world_size).integers(1, 200, size=301)
    shards = balanced_shards(atoms, world_size)
    assert len(shards) == world_size
    assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(len(atoms)))
    loads = np.array([atoms[s].sum() for s in shards])
    # Longest-processing-time first: no shard exceeds the mean by a whole structure.
    assert loads.max() - atoms.sum() / world_size < atoms.max()
    assert all(np.array_equal(a, b) for a, b in zip(shards, balanced_shards(atoms.copy(), world_size), strict=True))


def test_equal_sizes_go_round_robin_and_empty_shards_are_fine() -> None:
    assert [s.tolist() for s in balanced_shards([4, 4, 4, 4, 4], 2)] == [[0, 2, 4], [1, 3]]
    assert [s.tolist() for s in balanced_shards([3], 3)] == [[0], [], []]
    with pytest.raises(ConfigurationError, match="world_size"):
        balanced_shards([1], 0)


def test_shard_dataset_gives_each_structure_its_id_and_refuses_another() -> None:
    ds = ListDataset(random_structures([2, 3, 4]))
    shard = ShardDataset(ds, np.array([1, 2]), np.array([1, 2]))
    assert shard[1].system_id.tolist() == [2] and shard.get_all_metadata()[0].tolist() == [3, 4]
    wrong = ShardDataset(ds, np.array([0]), np.array([7]))
    ds[0].system_id = torch.tensor([0])
    with pytest.raises(InvalidDataError, match="system_ids"):
        wrong[0]


def test_dataset_ids_come_from_system_ids_when_the_dataset_has_them() -> None:
    class Tagged(ListDataset):
        def system_ids(self) -> np.ndarray:
            return np.array([10, 20])

    assert dataset_ids(Tagged(random_structures([2, 2]))).tolist() == [10, 20]
    assert dataset_ids(ListDataset(random_structures([2, 2]))).tolist() == [0, 1]


def make_run(ctx: Any) -> Any:
    sampler = SizeAwareSampler(ctx.dataset, max_atoms=12, max_batch_size=3)
    return DemoDynamics(model=DemoModelWrapper(), n_steps=8, dt=0.5, sampler=sampler, sinks=[ctx.sink])


def threads(world_size: int, target: Any) -> list[Any]:
    """Run ``target(backend)`` on every rank of an in-process group, each in a thread."""
    group = InProcessBackend.group(world_size=world_size, timeout_s=20.0)
    out: list[Any] = [None] * world_size

    def go(rank: int) -> None:
        try:
            out[rank] = target(group[rank])
        except BaseException as exc:  # returned, so the test sees every rank's outcome
            out[rank] = exc

    workers = [threading.Thread(target=go, args=(r,)) for r in range(world_size)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    return out


def test_two_thread_ranks_store_each_structure_once() -> None:
    results = MemoryResults()
    sizes = [2, 5, 3, 4, 6, 2, 3]
    out = threads(2, lambda b: run_data_parallel(make_run, ListDataset(random_structures(sizes)), results, backend=b))
    assert out[0].complete and out[0].ran == len(sizes) and out[1].committed == -1
    assert sorted(results.committed_ids().tolist()) == list(range(len(sizes)))
    shards = balanced_shards(np.array(sizes), 2)
    for rank, part in results.parts.items():
        assert sorted(part.read().system_id.tolist()) == shards[rank].tolist()


def test_ranks_that_see_different_datasets_refuse_to_run() -> None:
    results = MemoryResults()

    def target(b: Any) -> Any:
        sizes = [2, 3, 4] if b.rank == 0 else [2, 3]
        return run_data_parallel(make_run, ListDataset(random_structures(sizes)), results, backend=b)

    out = threads(2, target)
    assert all(isinstance(o, ConfigurationError) for o in out), out
    assert results.committed_count() == 0


def test_a_rerun_runs_only_what_is_missing() -> None:
    results = MemoryResults()
    sizes = [2, 3, 4, 5]
    first = run_data_parallel(make_run, ListDataset(random_structures(sizes[:2])), results)
    second = run_data_parallel(make_run, ListDataset(random_structures(sizes)), results)
    assert (first.ran, second.ran, second.skipped) == (2, 2, 2)
    assert second.complete and sorted(results.committed_ids().tolist()) == [0, 1, 2, 3]


def test_a_failing_rank_names_the_structures_it_did_not_store() -> None:
    def broken(ctx: Any) -> Any:
        raise RuntimeError("no model today")

    with pytest.raises(DataParallelError, match=r"no model today.*left 2 structures \(system_id 0, 1\)") as info:
        run_data_parallel(broken, ListDataset(random_structures([2, 3])), MemoryResults())
    assert info.value.failed_rank == 0 and info.value.unfinished == {0: [0, 1]}


def test_make_run_may_run_the_shard_itself() -> None:
    results = MemoryResults()

    def runs_itself(ctx: Any) -> str:
        stage = make_run(ctx)
        stage.hooks.append(ctx.watch)
        stage.run()
        return "done"

    assert run_data_parallel(runs_itself, ListDataset(random_structures([2, 3])), results).complete
    assert sorted(results.committed_ids().tolist()) == [0, 1]


def test_a_runnable_needs_a_hooks_list() -> None:
    class NoHooks:
        def run(self) -> None:
            pass

    with pytest.raises(DataParallelError, match="no hooks list"):
        run_data_parallel(lambda ctx: NoHooks(), ListDataset(random_structures([2])), MemoryResults())
