"""The store itself: layout, dtypes, reopening, capacity, schema checks, damaged and foreign stores."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zarr
from zarr_test_helpers import batch_for, memory_url

from alchemi_core.data import AtomicData, Batch
from alchemi_core.errors import InvalidDataError
from alchemi_core.testing import make_batch
from alchemi_core.testing.contracts import assert_same_systems
from alchemi_zarr import AtomicDataZarrReader, ZarrData, layout


def every_dtype_batch() -> Batch:
    """Systems with a field of every dtype a store holds, atom-, edge- and system-level."""
    structures = []
    for s, n in enumerate([3, 1, 4]):
        g = torch.Generator().manual_seed(s)
        i = torch.arange(n)
        structures.append(
            AtomicData(
                atomic_numbers=torch.randint(1, 90, (n,), generator=g),  # int64
                positions=torch.randn(n, 3, generator=g, dtype=torch.float32),
                velocities=torch.randn(n, 3, generator=g, dtype=torch.float64),
                neighbor_list=torch.stack([i, (i + 1) % n], dim=1),
                frozen=torch.rand(n, generator=g) < 0.5,  # bool
                half=torch.randn(n, generator=g).half(),
                brain=torch.randn(n, 2, generator=g).bfloat16(),
                label=torch.randint(0, 255, (n,), generator=g).to(torch.uint8),
                wave=torch.randn(n, generator=g, dtype=torch.complex64),
                weight=torch.randn(n, generator=g, dtype=torch.float64),
                tag=torch.tensor([s], dtype=torch.int32),  # int32, system level
                flags=torch.tensor([[s % 2 == 0, True]]),  # bool, system level
                status=torch.tensor([s]),
                levels={"frozen": "node", "half": "node", "brain": "node", "label": "node", "wave": "node",
                        "weight": "node", "tag": "system", "flags": "system"},
            )
        )
    batch = Batch.from_data_list(structures)
    batch.set_field("system_id", torch.tensor([10, 11, 12]), "system")
    return batch


def test_every_dtype_round_trips_through_sink_and_reader():
    url = memory_url()
    batch = every_dtype_batch()
    ZarrData(url).write(batch)
    assert_same_systems(batch, ZarrData(url).read())
    reader = AtomicDataZarrReader(url)
    for i, original in enumerate(batch.to_data_list()):
        got = reader[i]
        for k in original.keys():
            assert getattr(got, k).dtype == getattr(original, k).dtype, k
            assert torch.equal(getattr(got, k), getattr(original, k)), k


def test_layout_is_the_documented_one(tmp_path):
    path = tmp_path / "layout.zarr"
    batch = make_batch([3, 2], edges=True)
    batch.forces = torch.ones(5, 3)
    ZarrData(str(path), units={"shifts": "Å"}).write(batch)
    group = zarr.open_group(str(path), mode="r")
    header = group.attrs["alchemi"]
    assert header["format"] == layout.FORMAT_NAME and header["version"] == layout.FORMAT_VERSION
    assert header["fields"]["positions"] == {"level": "node", "dtype": "float32", "shape": [3], "units": "Å"}
    assert header["fields"]["forces"]["units"] == "eV/Å"
    assert header["fields"]["shifts"]["units"] == "Å"
    assert header["fields"]["system_id"] == {"level": "system", "dtype": "int64", "shape": [], "units": None}
    assert header["local_index_fields"] == ["neighbor_list"]
    assert group["commit"][:].tolist() == [2, 5, 5]
    assert group["atom_ptr"][:3].tolist() == [0, 3, 5]
    assert group["edge_ptr"][:3].tolist() == [0, 3, 5]
    # Neighbour indices are stored per system (local), so each record stands alone.
    assert group["edges/neighbor_list"][:5].tolist() == [[0, 1], [1, 2], [2, 0], [0, 1], [1, 0]]
    assert group["systems/cell"].shape[1:] == (3, 3)
    assert group["atoms/positions"].attrs["level"] == "node"


def test_reopening_appends_and_keeps_earlier_records(tmp_path):
    path = str(tmp_path / "reopen.zarr")
    first = ZarrData(path, capacity=100)
    first.write(batch_for([0, 1, 2]))
    again = ZarrData(path, capacity=100)
    assert len(again) == 3
    again.write(batch_for([3, 4]))
    assert ZarrData(path).read().system_id.tolist() == [0, 1, 2, 3, 4]
    # The first sink, still open, appends after what the second wrote instead of over it.
    first.write(batch_for([5]))
    assert_same_systems(batch_for([0, 1, 2, 3, 4, 5]), ZarrData(path).read())


def test_capacity_counts_existing_records_and_overflow_writes_nothing(tmp_path):
    path = str(tmp_path / "cap.zarr")
    ZarrData(path, capacity=4).write(batch_for([0, 1, 2]))
    sink = ZarrData(path, capacity=4)
    with pytest.raises(RuntimeError, match="holds 3 of 4"):
        sink.write(batch_for([3, 4]))
    assert len(sink) == 3 and len(ZarrData(path)) == 3
    assert AtomicDataZarrReader(path).read_batch().system_id.tolist() == [0, 1, 2]
    sink.write(batch_for([3]))
    assert sink.is_full()


def test_a_record_with_other_fields_is_refused_and_nothing_is_written():
    url = memory_url()
    sink = ZarrData(url)
    sink.write(batch_for([0, 1]))
    other = batch_for([2])
    other.set_field("fmax", torch.zeros(1, dtype=torch.float64), "system")
    with pytest.raises(InvalidDataError, match=r"fields the store lacks \['fmax'\]"):
        sink.write(other)
    wrong_dtype = Batch.from_data_list([make_batch([2]).to_data_list()[0]])
    with pytest.raises(InvalidDataError, match="missing fields"):
        sink.write(wrong_dtype)
    assert len(sink) == 2


def test_zero_empties_the_store_and_lets_it_take_new_fields(tmp_path):
    path = str(tmp_path / "zero.zarr")
    sink = ZarrData(path)
    sink.write(batch_for([0, 1]))
    sink.zero()
    assert len(ZarrData(path)) == 0
    with pytest.raises(RuntimeError, match="empty"):
        ZarrData(path).read()
    fresh = make_batch([2, 3], extras=True)
    sink.write(fresh)
    assert_same_systems(fresh, ZarrData(path).read())


def test_uncommitted_tail_is_ignored_and_overwritten(tmp_path):
    """Rows past the commit (what a crash between data and commit leaves) are not records."""
    path = str(tmp_path / "tail.zarr")
    ZarrData(path).write(batch_for([0, 1]))
    group = zarr.open_group(path, mode="a")
    # A crashed append: data and pointers of a third system written, commit not.
    group["systems/system_id"].resize((8,))
    group["systems/system_id"][2] = 99
    group["atom_ptr"].resize((8,))
    group["atom_ptr"][3] = 1000
    assert len(AtomicDataZarrReader(path)) == 2
    sink = ZarrData(path)
    sink.write(batch_for([2]))
    assert_same_systems(batch_for([0, 1, 2]), sink.read())


def test_a_crashed_first_append_leaves_an_empty_store(tmp_path):
    """Header written, arrays half made, nothing committed: readers see an empty store."""
    path = str(tmp_path / "first.zarr")
    store = ZarrData(path).store
    store._group.attrs["alchemi"] = layout.Header(
        {"positions": layout.FieldSpec.of("positions", "node", torch.zeros(1, 3))}
    ).to_json()
    reader = AtomicDataZarrReader(path)
    assert len(reader) == 0 and reader.fields == {} and reader.get_all_metadata()[0].tolist() == []
    sink = ZarrData(path)
    sink.write(batch_for([0, 1]))
    assert_same_systems(batch_for([0, 1]), AtomicDataZarrReader(path).read_batch())


def test_damaged_pointers_are_reported(tmp_path):
    path = str(tmp_path / "damaged.zarr")
    ZarrData(path).write(batch_for([0, 1]))
    zarr.open_group(path, mode="a")["atom_ptr"][2] = 3
    with pytest.raises(InvalidDataError, match="damaged"):
        AtomicDataZarrReader(path)


def test_foreign_and_newer_stores_are_refused(tmp_path):
    foreign = zarr.open_group(str(tmp_path / "foreign.zarr"), mode="a")
    foreign.create_array("x", shape=(3,), dtype="int32")
    with pytest.raises(InvalidDataError, match="not an alchemi store"):
        ZarrData(str(tmp_path / "foreign.zarr"))
    path = str(tmp_path / "newer.zarr")
    ZarrData(path).write(batch_for([0]))
    group = zarr.open_group(path, mode="a")
    group.attrs["alchemi"] = {**group.attrs["alchemi"], "version": layout.FORMAT_VERSION + 1}
    with pytest.raises(InvalidDataError, match="Upgrade alchemi-zarr"):
        AtomicDataZarrReader(path)
    with pytest.raises(InvalidDataError, match="no store at"):
        AtomicDataZarrReader(str(tmp_path / "missing.zarr"))
    url = memory_url()
    zarr.create_array(url, shape=(3,), dtype="int32")  # an array where the group would be
    with pytest.raises(InvalidDataError, match="not an alchemi store"):
        ZarrData(url)


def test_file_urls_dicts_and_store_objects_are_stores(tmp_path):
    path = tmp_path / "url.zarr"
    ZarrData(f"file://{path}").write(batch_for([0]))
    assert len(AtomicDataZarrReader(path)) == 1  # a Path works as well
    backing: dict = {}
    ZarrData(backing).write(batch_for([1, 2]))
    assert AtomicDataZarrReader(backing).read_batch().system_id.tolist() == [1, 2]
    store = zarr.storage.MemoryStore()
    ZarrData(store).write(batch_for([3]))
    assert len(AtomicDataZarrReader(store)) == 1


def test_edge_fields_without_any_edges_and_tensors_with_grad():
    url = memory_url()
    lonely = make_batch([1, 1], edges=True)  # neighbor_list and shifts with zero rows
    sink = ZarrData(url)
    sink.write(lonely)
    assert_same_systems(lonely, sink.read())
    assert AtomicDataZarrReader(url)[1].neighbor_list.shape == (0, 2)
    tracked = make_batch([3, 2])
    tracked.positions.requires_grad_(True)
    other = ZarrData(memory_url())
    other.write(tracked)
    assert torch.equal(other.read().positions, tracked.positions.detach())


def test_large_appends_cross_chunk_boundaries(monkeypatch):
    monkeypatch.setattr(layout, "CHUNK_BYTES", 32 * 1024)  # 2048 rows of positions per chunk
    url = memory_url()
    sink = ZarrData(url)
    ids = list(range(3000))  # ~15000 atoms: positions span several chunks, pointers one
    for lo in range(0, len(ids), 700):
        sink.write(batch_for(ids[lo : lo + 700]))
    got = ZarrData(url).read()
    assert got.system_id.tolist() == ids
    assert_same_systems(batch_for(ids[2990:]), got.index_select(list(range(2990, 3000))))
    group = zarr.open_group(url, mode="r")
    assert group["atoms/positions"].chunks[0] < got.num_nodes


def test_negative_capacity_and_bad_store_arguments_are_refused():
    with pytest.raises(ValueError, match="capacity"):
        ZarrData(memory_url(), capacity=-1)
    with pytest.raises(InvalidDataError, match="store must be"):
        ZarrData(3.5)


def test_an_s3_url_without_s3fs_says_what_to_install():
    pytest.importorskip("fsspec")
    try:
        import s3fs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("s3fs is installed; this checks the message when it is not")
    from alchemi_core.errors import MissingDependencyError

    with pytest.raises(MissingDependencyError, match=r"pip install alchemi-zarr\[s3\]"):
        ZarrData("s3://some-bucket/results.zarr")


def test_chunk_rows_aim_at_a_fixed_chunk_size():
    assert layout.chunk_rows(12) == 32768  # float32 positions: 384 KiB chunks
    assert layout.chunk_rows(8) == 65536
    assert layout.chunk_rows(1) == layout.MAX_CHUNK_ROWS
    assert layout.chunk_rows(10**6) == layout.MIN_CHUNK_ROWS
    assert np.log2(layout.chunk_rows(72)).is_integer()


@pytest.mark.parametrize("field", ["positions", "atomic_numbers"])  # a float (crc32c) and an int (blosc, crc32c) field
def test_a_damaged_chunk_is_an_error_not_wrong_numbers(tmp_path, field):
    path = tmp_path / "flipped.zarr"
    ZarrData(str(path)).write(batch_for(list(range(20))))
    chunk = next(p for p in (path / "atoms" / field).rglob("*") if p.is_file() and p.name != "zarr.json")
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(Exception, match="(?i)checksum|crc|corrupt|zstd|decompress"):
        AtomicDataZarrReader(str(path)).read_batch()


def test_a_store_with_the_earlier_zstd_codec_is_continued_and_read(tmp_path, monkeypatch):
    """Stores written before blosc (zstd for integer fields) take appends and read back whole."""
    from zarr.codecs import Crc32cCodec, ZstdCodec

    from alchemi_zarr import storage

    path = str(tmp_path / "old.zarr")
    with monkeypatch.context() as m:
        m.setattr(storage, "_compressors",
                  lambda dtype=None: [Crc32cCodec()] if dtype is not None and dtype.kind in "fc"
                  else [ZstdCodec(level=1, checksum=True)])
        ZarrData(path).write(make_batch([3, 4], edges=True))
    codecs = zarr.open_group(path, mode="r")["atoms/atomic_numbers"].metadata.codecs
    assert any(isinstance(c, ZstdCodec) for c in codecs)
    later = make_batch([5, 2, 6], edges=True)
    later.system_id.add_(10)
    sink = ZarrData(path)  # reopened with today's code: appends through the old codecs
    sink.write(later)
    stored = sink.read()
    assert_same_systems(make_batch([3, 4], edges=True), stored.index_select([0, 1]))
    assert_same_systems(later, stored.index_select([2, 3, 4]))
