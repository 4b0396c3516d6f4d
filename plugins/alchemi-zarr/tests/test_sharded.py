"""Sharded results stores: a part per writing rank under one root, read back as one set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from alchemi_core.errors import InvalidDataError
from alchemi_core.testing import make_batch
from alchemi_zarr import AtomicDataZarrReader, ShardedZarrReader, ShardedZarrStore, ZarrData, open_reader


def shifted(sizes: list[int], first_id: int):  # type: ignore[no-untyped-def]
    batch = make_batch(sizes)
    batch.system_id.add_(first_id)
    return batch


def test_parts_read_back_as_one_set(tmp_path: Path) -> None:
    root = ShardedZarrStore(tmp_path / "r.zarr")
    root.sink(1).write(shifted([4, 2], 10))
    root.sink(0).write(shifted([3], 0))
    root.sink(0).write(shifted([5], 1))
    assert sorted(p.name for p in (tmp_path / "r.zarr").iterdir() if p.is_dir()) == ["part-00000", "part-00001"]
    assert sorted(root.committed_ids().tolist()) == [0, 1, 10, 11] and root.committed_count() == 4
    reader = root.reader()
    assert len(reader) == 4 and reader.system_ids().tolist() == [0, 1, 10, 11]
    assert [reader.get_metadata(i) for i in range(4)] == [(3, 0), (5, 0), (4, 0), (2, 0)]
    assert reader.get_all_metadata()[0].tolist() == [3, 5, 4, 2]
    assert reader[2].system_id.tolist() == [10] and reader[-1].num_nodes == 2
    batch = reader.read_batch(1, 3)
    assert batch.system_id.tolist() == [1, 10] and batch.num_nodes_list == [5, 4]
    expected = shifted([4, 2], 10)
    assert np.array_equal(reader.read_batch(2).positions.numpy(), expected.positions.numpy())
    assert [d.num_nodes for d in reader] == [3, 5, 4, 2]
    with pytest.raises(IndexError):
        reader[4]


def test_a_reopened_root_continues_and_a_reader_refreshes(tmp_path: Path) -> None:
    path = tmp_path / "r.zarr"
    ShardedZarrStore(path).sink(0).write(shifted([3], 0))
    reader = ShardedZarrReader(path)
    ShardedZarrStore(path).sink(2).write(shifted([2], 5))
    assert len(reader) == 1 and reader.refresh() == 2
    assert isinstance(open_reader(path), ShardedZarrReader)
    assert isinstance(open_reader(ShardedZarrStore(path).part(0)), AtomicDataZarrReader)


def test_roots_and_single_stores_are_not_confused(tmp_path: Path) -> None:
    single = tmp_path / "single.zarr"
    ZarrData(single).write(make_batch([2]))
    with pytest.raises(InvalidDataError, match="single alchemi store"):
        ShardedZarrStore(single)
    root = tmp_path / "root.zarr"
    ShardedZarrStore(root)
    with pytest.raises(InvalidDataError, match="sharded results store"):
        ZarrData(root).write(make_batch([1]))  # it reads as one set, but each rank writes its part
    ShardedZarrStore(root).sink(0).write(make_batch([2]))
    with pytest.raises(InvalidDataError, match="ShardedZarrReader"):
        AtomicDataZarrReader(root)
    with pytest.raises(InvalidDataError, match="single alchemi store, not the root"):
        ShardedZarrReader(single)


def test_memory_urls_and_extxyz_export(tmp_path: Path) -> None:
    ase_io = pytest.importorskip("ase.io")
    root = ShardedZarrStore("memory://sharded-test")
    root.sink(0).write(shifted([3], 0))
    root.sink(1).write(shifted([2], 1))
    out = tmp_path / "all.extxyz"
    assert root.reader().to_extxyz(out) == 2
    assert [len(a) for a in ase_io.read(out, index=":")] == [3, 2]


def test_trajectory_frames_do_not_count_as_results(tmp_path: Path) -> None:
    root = ShardedZarrStore(tmp_path / "r.zarr", frame_statuses=range(2))
    frames = make_batch([3, 2])
    frames.set_field("status", frames.system_id.new_tensor([0, 1]), "system")
    root.sink(0).write(frames)  # snapshots of structures 0 and 1 in stages 0 and 1
    final = make_batch([3])
    final.set_field("status", final.system_id.new_tensor([2]), "system")
    root.sink(0).write(final)  # structure 0's result (exit status 2)
    assert root.committed_ids().tolist() == [0] and root.committed_count() == 1
    assert sorted(ShardedZarrStore(tmp_path / "r.zarr").committed_ids().tolist()) == [0, 0, 1]


def test_a_root_whose_mark_was_overwritten_still_reads_and_is_marked_again(tmp_path: Path) -> None:
    """Ranks create the root at once, and one's creation can overwrite another's mark."""
    import zarr

    path = tmp_path / "r.zarr"
    root = ShardedZarrStore(path)
    root.sink(0).write(make_batch([2]))
    group = zarr.open_group(str(path), mode="a", zarr_format=3)
    del group.attrs["alchemi_sharded"]
    assert len(ShardedZarrReader(path)) == 1  # parts and nothing else: a root
    assert root.committed_ids().tolist() == [0]
    assert "alchemi_sharded" in zarr.open_group(str(path), mode="r").attrs  # the writer marked it again
    bare = tmp_path / "bare.zarr"
    zarr.open_group(str(bare), mode="a", zarr_format=3)
    with pytest.raises(InvalidDataError, match="not a sharded"):
        ShardedZarrReader(bare)
    assert ShardedZarrStore(bare).committed_count() == 0



def test_a_root_another_rank_creates_at_the_same_moment_is_opened(tmp_path: Path, monkeypatch) -> None:
    """Every rank of a data-parallel run opens the new root at once; two may both find it absent,
    and zarr tells the second to create it that it exists (ContainsGroupError: about one
    four-rank run in four on 2 cores failed so). Here the other rank's creation lands between
    this one's look and its write, every time: the store must open the group that is there."""
    import zarr
    from zarr.errors import ContainsGroupError

    root = str(tmp_path / "results.zarr")
    real = zarr.open_group
    raced: list[bool] = []

    def open_group(store, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not raced:
            raced.append(True)
            real(store, *args, **kwargs)  # the other rank creates the root ...
            raise ContainsGroupError("A group exists in store at path ''.")  # ... and this one is told
        return real(store, *args, **kwargs)

    monkeypatch.setattr(zarr, "open_group", open_group)
    store = ShardedZarrStore(root)
    assert raced and store.committed_ids().size == 0
    monkeypatch.undo()
    store.sink(0).write(shifted([2, 3], 0))
    assert sorted(store.committed_ids().tolist()) == [0, 1]
