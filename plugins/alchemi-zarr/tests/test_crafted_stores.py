"""Stores crafted or damaged by hand, and paths a store cannot take, are refused by name
(issue 59, finding 6): a chunk failing its checksum names the store and the array; a batch read
checks records as ``reader[i]`` does; a write never lands in a foreign Zarr group, beside a
user's files, or as a raw ``FileExistsError``; a store written twice over is refused by the
results functions."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from zarr_test_helpers import assert_matches_id, batch_for, memory_url

from alchemi_core.errors import InvalidDataError
from alchemi_zarr import AtomicDataZarrReader, ShardedZarrReader, ShardedZarrStore, ZarrData


def _fingerprint(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


def _flip_a_chunk(root: Path, array: str) -> None:
    chunk = next(p for p in sorted((root / array).rglob("*")) if p.is_file() and p.name != "zarr.json")
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))


@pytest.mark.parametrize("array", ["atoms/positions", "atoms/atomic_numbers", "systems/energy"])
def test_a_chunk_failing_its_checksum_names_the_store_and_the_array(tmp_path, array):
    path = tmp_path / "flipped.zarr"
    ZarrData(str(path)).write(batch_for(list(range(6))))
    _flip_a_chunk(path, array)
    reads = {
        "reader[i]": lambda: AtomicDataZarrReader(path)[2],
        "read_batch": lambda: AtomicDataZarrReader(path).read_batch(),
        "ZarrData.read": lambda: ZarrData(str(path)).read(),
    }
    for name, read in reads.items():
        with pytest.raises(InvalidDataError) as err:
            read()
        text = str(err.value)
        assert str(path) in text and repr(array) in text and "damaged" in text, (name, text)


def _store_with_bad_records(url: str) -> None:
    """Records 0 and 3 valid; 1 has NaN positions, 2 a negative atomic number."""
    batch = batch_for([0, 1, 2, 3])
    starts = np.concatenate(([0], np.cumsum(batch.num_nodes_per_system)[:-1]))
    ZarrData(url).write(batch)
    group = zarr.open_group(url, mode="a")
    group["atoms/positions"][int(starts[1])] = np.full(3, np.nan)
    group["atoms/atomic_numbers"][int(starts[2]) + 1] = -3


def test_read_batch_checks_records_as_reader_index_does():
    url = memory_url()
    _store_with_bad_records(url)
    reader = AtomicDataZarrReader(url)
    assert_matches_id(reader[0])
    assert_matches_id(reader[3])
    for index, match in ((1, "record 1 of .*system_id 1.* positions hold NaN"),
                         (2, "record 2 of .*system_id 2.* atomic number -3 at atom 1")):
        with pytest.raises(InvalidDataError, match=match) as one:
            reader[index]
        with pytest.raises(InvalidDataError) as many:
            reader.read_batch(index, index + 1)
        assert str(one.value) == str(many.value)  # one check, one message
    with pytest.raises(InvalidDataError, match="record 1 of"):  # the first bad record of the range
        reader.read_batch()
    with pytest.raises(InvalidDataError, match="record 2 of"):
        reader.read_batch(2, 4)
    with pytest.raises(InvalidDataError, match="record 1 of"):
        ZarrData(url).read()
    assert reader.read_batch(3, 4).system_id.tolist() == [3]


def test_neighbour_indices_outside_their_record_and_bad_masses_are_refused():
    url = memory_url()
    batch = batch_for([0, 1])
    batch.set_field("atomic_masses", torch.ones(batch.num_nodes, dtype=torch.float64), "node")
    ZarrData(url).write(batch)
    group = zarr.open_group(url, mode="a")
    group["edges/neighbor_list"][0] = np.array([0, 40])  # record 0 has 2 atoms
    group["atoms/atomic_masses"][int(batch.num_nodes_per_system[0])] = -1.0  # record 1, atom 0
    reader = AtomicDataZarrReader(url)
    with pytest.raises(InvalidDataError, match=r"record 0 of .*neighbor_list holds atom indices \[0, 40\]"):
        reader.read_batch()
    with pytest.raises(InvalidDataError, match="record 1 of .*atomic mass -1 at atom 0"):
        reader.read_batch(1, 2)
    with pytest.raises(InvalidDataError, match="record 1 of .*atomic mass -1"):
        reader[1]


def _v2_group(path: Path) -> None:
    group = zarr.open_group(str(path), mode="w", zarr_format=2)
    group.create_array("data", shape=(4,), dtype="float64")


def _v3_group_with_attributes(path: Path) -> None:
    zarr.open_group(str(path), mode="w", zarr_format=3).attrs["owner"] = "someone else"


def _folder_of_user_files(path: Path) -> None:
    path.mkdir()
    (path / "notes.txt").write_text("my notes")


@pytest.mark.parametrize(("make", "says"), [
    (_v2_group, "Zarr v2 group"),
    (_v3_group_with_attributes, "not an alchemi store"),
    (_folder_of_user_files, "notes.txt"),
])
def test_a_sink_never_writes_into_a_foreign_group_or_beside_other_files(tmp_path, make, says):
    target = tmp_path / "target.zarr"
    make(target)
    before = _fingerprint(target)
    with pytest.raises(InvalidDataError, match=says) as err:
        ZarrData(str(target)).write(batch_for([0]))
    assert str(target) in str(err.value) and "new path" in str(err.value)
    assert _fingerprint(target) == before, "the foreign folder was changed"


def test_a_foreign_v2_group_behind_a_url_is_refused():
    url = memory_url()
    zarr.open_group(url, mode="w", zarr_format=2).create_array("data", shape=(2,), dtype="int32")
    with pytest.raises(InvalidDataError, match="Zarr v2 group"):
        ZarrData(url)


def test_a_file_or_an_unwritable_folder_is_named_with_what_to_do(tmp_path):
    a_file = tmp_path / "results.zarr"
    a_file.write_text("not a folder")
    with pytest.raises(InvalidDataError, match=f"{a_file} is a file, not a folder.*new path"):
        ZarrData(str(a_file))
    with pytest.raises(InvalidDataError, match="cannot create the store folder /proc/no-such-dir/results.zarr"):
        ZarrData("/proc/no-such-dir/results.zarr")
    empty = tmp_path / "empty.zarr"
    empty.mkdir()  # an empty folder is a new store
    ZarrData(str(empty)).write(batch_for([0]))
    assert len(AtomicDataZarrReader(empty)) == 1


def test_one_write_holding_a_system_id_twice_is_refused_and_writes_nothing():
    url = memory_url()
    sink = ZarrData(url)
    sink.write(batch_for([0, 1]))
    twice = batch_for([2, 3, 2])
    with pytest.raises(InvalidDataError, match=r"system_id \[2\] more than once; nothing was written"):
        sink.write(twice)
    assert len(AtomicDataZarrReader(url)) == 2
    sink.write(batch_for([0, 1]))  # a later write of the same systems is a trajectory's next frame
    assert len(AtomicDataZarrReader(url)) == 4


def test_zarr_data_reads_a_sharded_store_as_one_set(tmp_path):
    root = tmp_path / "campaign.zarr"
    results = ShardedZarrStore(root)
    results.sink(0).write(batch_for([0, 2]))
    results.sink(1).write(batch_for([1]))
    sink = ZarrData(root)
    assert len(sink) == 3
    batch = sink.read()
    assert batch.system_id.tolist() == [0, 2, 1]
    for data in batch.to_data_list():
        assert_matches_id(data)
    assert isinstance(sink.reader(), ShardedZarrReader) and len(sink.reader()) == 3
    assert sink.reader().get_all_system_ids().tolist() == [0, 2, 1]  # the single-store reader's API
    assert sink.to_extxyz(tmp_path / "all.extxyz") == 3
    with pytest.raises(InvalidDataError, match=r"sharded results store.*ShardedZarrStore\(root\)\.sink\(rank\)"):
        sink.write(batch_for([3]))
    results.sink(2).write(batch_for([3]))
    assert len(sink) == 4 and sink.read().system_id.tolist() == [0, 2, 1, 3]  # later parts are seen


def _results(ids: list[int], status: int, steps: int):
    batch = batch_for(ids)
    batch.set_field("status", torch.full((len(ids),), status), "system")
    batch.set_field("stage_steps", torch.full((len(ids),), steps), "system")
    return batch


def test_a_run_store_holding_a_result_twice_is_refused_on_read(tmp_path):
    """Frames of one structure (other status or step) read, and so do frames repeated by a run
    that was interrupted and run again; a structure's result stored twice does not."""
    url = memory_url()
    sink = ZarrData(url)
    sink.write(_results([0, 1], 0, 10))  # trajectory frames
    sink.write(_results([0, 1], 0, 20))
    sink.write(_results([0], 0, 10))  # 0's trajectory again (the run was interrupted and rerun)
    sink.write(_results([0, 1], 1, 20))  # the results
    assert sink.read().num_graphs == 7
    sink.write(_results([1], 1, 20))  # 1's result again, as a rerun into the same store did
    with pytest.raises(InvalidDataError, match=r"stored twice.*system_id 1 at records \[6, 7\]"):
        ZarrData(url).read()
    assert AtomicDataZarrReader(url).read_batch(0, 8).num_graphs == 8  # a range read gives the records as stored
    root = tmp_path / "campaign.zarr"
    results = ShardedZarrStore(root)
    results.sink(0).write(_results([0, 2], 1, 5))
    results.sink(1).write(_results([2], 1, 5))  # two ranks stored structure 2
    with pytest.raises(InvalidDataError, match=r"system_id 2 at records \[1, 2\]"):
        ZarrData(root).read()
