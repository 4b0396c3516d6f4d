"""Chunks encoded by alchemi-zarr itself must be the bytes zarr writes, and read back by zarr."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

from alchemi_zarr.aligned import ChunkTails
from alchemi_zarr.chunks import encoder, write_pieces

CHAINS = {
    "crc32c": [Crc32cCodec()],
    "blosc+crc32c": [BloscCodec(cname="lz4", clevel=1, shuffle="shuffle", typesize=8), Crc32cCodec()],
    "zstd": [ZstdCodec(level=1, checksum=True)],
}


def _values(dtype: str, rows: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    if dtype == "bool":
        return rng.random((rows, 3)) > 0.5
    if dtype.startswith("int"):
        return rng.integers(-50, 50, size=(rows, 3)).astype(dtype)
    return rng.standard_normal((rows, 3)).astype(dtype)


@pytest.mark.parametrize("chain", CHAINS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32", "bool"])
def test_direct_chunks_are_the_bytes_zarr_writes(chain, dtype, tmp_path):
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", zarr_format=3)
    codecs = CHAINS[chain]
    if chain == "blosc+crc32c":
        codecs = [BloscCodec(cname="lz4", clevel=1, shuffle="shuffle", typesize=np.dtype(dtype).itemsize), Crc32cCodec()]
    made = {
        name: group.create_array(name, shape=(24, 3), dtype=dtype, chunks=(8, 3), compressors=codecs, fill_value=0)
        for name in ("direct", "zarr")
    }
    assert encoder(made["direct"]) is not None
    values = _values(dtype, 24)
    write_pieces([(made["direct"], slice(0, 24), values)])
    made["zarr"][:] = values
    np.testing.assert_array_equal(made["direct"][:], values)
    for chunk in range(3):
        ours = (tmp_path / "g.zarr" / "direct" / "c" / str(chunk) / "0").read_bytes()
        theirs = (tmp_path / "g.zarr" / "zarr" / "c" / str(chunk) / "0").read_bytes()
        assert ours == theirs


def test_pieces_that_are_not_whole_chunks_go_through_zarr():
    group = zarr.open_group("memory://chunks-partial", mode="w", zarr_format=3)
    arr = group.create_array("x", shape=(16,), dtype="int64", chunks=(8,), compressors=[Crc32cCodec()], fill_value=0)
    write_pieces([(arr, slice(3, 6), np.array([7, 8, 9]))])
    assert arr[:8].tolist() == [0, 0, 0, 7, 8, 9, 0, 0]


def test_arrays_with_other_codecs_are_left_to_zarr():
    from zarr.codecs import GzipCodec

    group = zarr.open_group("memory://chunks-other", mode="w", zarr_format=3)
    arr = group.create_array("x", shape=(16,), dtype="f4", chunks=(8,), compressors=[GzipCodec()], fill_value=0)
    assert encoder(arr) is None
    write_pieces([(arr, slice(0, 16), np.arange(16, dtype="f4"))])
    assert arr[:].tolist() == list(range(16))


def test_aligned_appends_keep_earlier_rows_of_a_shared_chunk():
    """Appends of odd sizes through ChunkTails and write_pieces equal one assignment of all rows."""
    group = zarr.open_group("memory://chunks-appends", mode="w", zarr_format=3)
    arr = group.create_array("x", shape=(64, 3), dtype="f8", chunks=(8, 3), compressors=[Crc32cCodec()], fill_value=0)
    tails, at, everything = ChunkTails(), 0, []
    for size in (3, 5, 11, 1, 16, 7):
        rows = _values("float64", size) + at
        pieces = tails.pieces("x", at, rows, 8, read_tail=lambda a, b: arr[a:b])
        write_pieces([(arr, slice(first, first + len(v)), v) for first, v in pieces])
        at += size
        everything.append(rows)
    np.testing.assert_array_equal(arr[:at], np.concatenate(everything))


def test_a_reopened_store_reads_the_tail_it_did_not_write(tmp_path):
    """The first append after reopening reads the last chunk's committed rows from the store."""
    group = zarr.open_group(str(tmp_path / "t.zarr"), mode="w", zarr_format=3)
    arr = group.create_array("x", shape=(32,), dtype="i8", chunks=(8,), compressors=[Crc32cCodec()], fill_value=0)
    first = ChunkTails().pieces("x", 0, np.arange(5), 8, read_tail=None)
    write_pieces([(arr, slice(s, s + len(v)), v) for s, v in first])
    again = ChunkTails().pieces("x", 5, np.arange(5, 9), 8, read_tail=lambda a, b: arr[a:b])
    write_pieces([(arr, slice(s, s + len(v)), v) for s, v in again])
    assert arr[:9].tolist() == list(range(9))


def test_every_array_a_store_lays_out_is_encoded_here(tmp_path, monkeypatch):
    """Whatever zarr is installed, an append of alchemi's records encodes every chunk itself:
    zarr 3.4 renamed the chunk grid's class and made the endianness a string, and a check by the
    old names sent each chunk through zarr without a word (found on the GPU host's Python 3.12)."""
    import warnings

    from alchemi_core.testing import make_batch
    from alchemi_zarr import chunks
    from alchemi_zarr.records import HostRecords, snapshot
    from alchemi_zarr.storage import AtomicStore

    through_zarr: list[str] = []
    original = chunks.encoder

    def spying(arr):  # noqa: ANN001, ANN202
        found = original(arr)
        if found is None:
            through_zarr.append(arr.path)
        return found

    monkeypatch.setattr(chunks, "encoder", spying)
    store = AtomicStore(str(tmp_path / "s.zarr"), read_only=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        store.append(HostRecords.from_snapshot(snapshot(make_batch([3, 2]), copy=False)))
    assert store.header is not None and len(store.header.fields) >= 4
    assert through_zarr == []


def test_an_unexpected_failure_to_read_the_metadata_is_said_once(monkeypatch):
    import warnings

    from alchemi_zarr import chunks

    class Unreadable:
        """An array whose metadata a future zarr keeps somewhere this module does not know."""

        dtype = np.dtype("f4")

        @property
        def metadata(self):  # noqa: ANN201
            raise AttributeError("no metadata here")

    monkeypatch.setattr(chunks, "_WARNED", set())
    with pytest.warns(RuntimeWarning, match="cannot encode chunks itself.*no metadata here"):
        assert encoder(Unreadable()) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert encoder(Unreadable()) is None  # said once


def test_local_chunks_past_the_records_are_written_in_place_and_the_others_replaced(tmp_path):
    """A chunk holding committed rows is replaced whole (a new file renamed over it: a crash
    leaves its old bytes or its new ones); a chunk past them is written in place, and both read
    back as written."""
    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", zarr_format=3)
    arr = group.create_array("x", shape=(24, 3), dtype="f4", chunks=(8, 3), compressors=[Crc32cCodec()], fill_value=0)
    write_pieces([(arr, slice(0, 24), _values("float32", 24))], committed={"x": 0})
    chunk_file = {c: tmp_path / "g.zarr" / "x" / "c" / str(c) / "0" for c in range(3)}
    before = {c: f.stat().st_ino for c, f in chunk_file.items()}
    values = _values("float32", 16) + 1
    write_pieces([(arr, slice(8, 24), values)], committed={"x": 12})  # rows 8-11 of chunk 1 are records
    after = {c: f.stat().st_ino for c, f in chunk_file.items()}
    assert after[1] != before[1]  # replaced
    assert after[2] == before[2]  # written in place
    np.testing.assert_array_equal(arr[8:24], values)
    assert not list((tmp_path / "g.zarr").rglob("*.partial"))
    write_pieces([(arr, slice(16, 24), values[:8])])  # no commit given: every chunk replaced
    assert chunk_file[2].stat().st_ino != after[2]


@pytest.mark.parametrize("threads", [1, 3])
def test_chunk_files_are_all_written_before_an_error_in_one_is_raised(tmp_path, threads):
    from alchemi_zarr.local_files import ChunkFile, write_files

    files = [ChunkFile(f"x/c/{i}/0", [bytes([i]) * 10], in_place=i % 2 == 0) for i in range(7)]
    files[3] = ChunkFile("x/c/3/0", [object()], in_place=False)  # not bytes: this write fails
    with pytest.raises(TypeError):
        write_files(tmp_path, files, threads=threads)
    written = {i: f.read_bytes() for i in range(7) if (f := tmp_path / f"x/c/{i}/0").exists()}
    # Thread k takes files k, k + threads, ...: the failing thread stops at file 3, and every
    # other thread's files are written before the error reaches the caller.
    failing = 3 % threads
    expected = {i for i in range(7) if i % threads != failing or i < 3}
    assert written == {i: bytes([i]) * 10 for i in expected}
    assert not list(tmp_path.rglob("*.partial"))


def test_the_file_writers_are_made_once_and_grown_only_when_more_are_needed(tmp_path):
    from alchemi_zarr import local_files
    from alchemi_zarr.local_files import ChunkFile, write_files

    def files(n, tag):
        return [ChunkFile(f"{tag}/c/{i}/0", [b"x"], in_place=True) for i in range(n)]

    write_files(tmp_path, files(4, "a"), threads=4)
    pool = local_files._pool(1)
    write_files(tmp_path, files(2, "b"), threads=4)  # two files, two threads: the same writers
    write_files(tmp_path, files(3, "c"), threads=3)
    assert local_files._pool(1) is pool
    write_files(tmp_path, files(6, "d"), threads=6)  # more threads than ever: a larger pool
    assert local_files._pool(1) is not pool
    assert sum(p.is_file() for p in tmp_path.rglob("*")) == 4 + 2 + 3 + 6


@pytest.mark.parametrize("chain", CHAINS)
def test_a_local_chunk_read_here_is_what_zarr_reads(chain, tmp_path):
    from alchemi_zarr.chunks import read_local_chunk

    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", zarr_format=3)
    arr = group.create_array("x", shape=(24, 3), dtype="int64", chunks=(8, 3), compressors=CHAINS[chain], fill_value=7)
    arr[:16] = _values("int64", 16)
    for index in range(3):  # the third chunk was never written: its fill value
        np.testing.assert_array_equal(read_local_chunk(arr, index), arr[8 * index : 8 * index + 8])
    chunk = tmp_path / "g.zarr" / "x" / "c" / "1" / "0"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="c/1/0"):
        read_local_chunk(arr, 1)
    memory = zarr.open_group("memory://chunk-read", mode="w", zarr_format=3)
    elsewhere = memory.create_array("x", shape=(8,), dtype="int64", chunks=(8,), compressors=CHAINS[chain])
    assert read_local_chunk(elsewhere, 0) is None  # not a local store: zarr reads it
