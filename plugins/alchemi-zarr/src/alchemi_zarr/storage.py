"""``AtomicStore``: one alchemi Zarr store (layout in :mod:`alchemi_zarr.layout`), appended to
whole records at a time and read by row ranges.

An append writes the header (only into an empty store), any array growth, the data rows and
the pointers past the committed end, and last the ``commit`` array. Every write of an object that
holds committed data replaces it atomically, so a crash at any point leaves the old commit and its
records untouched; the uncommitted tail is ignored on reopening and overwritten by the next append.

Example:
    >>> from alchemi_core.testing import make_batch
    >>> from alchemi_zarr.records import HostRecords, snapshot
    >>> store = AtomicStore("memory://storage-doc", read_only=False)
    >>> store.append(HostRecords.from_snapshot(snapshot(make_batch([3, 2]), copy=False)))
    >>> store.num_systems, store.num_atoms, store.pointers()[0].tolist()
    (2, 5, [0, 3, 5])
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from alchemi_core.data import AtomicData, Batch
from alchemi_core.data.fields import INDEX_FIELDS, Level
from alchemi_core.errors import InvalidDataError
from alchemi_zarr import layout
from alchemi_zarr.aligned import ChunkTails
from alchemi_zarr.chunks import read_local_chunk, write_pieces
from alchemi_zarr.layout import FieldSpec, Header
from alchemi_zarr.records import HostRecords, to_batch_indices, to_tensor
from alchemi_zarr.stores import resolve_store, writer_lock
from alchemi_zarr.validity import check_records

_LEVEL_INDEX = {Level.SYSTEM: 0, Level.NODE: 1, Level.EDGE: 2}


def _compressors(dtype: np.dtype | None = None) -> Any:
    """Codecs of one array: blosc's lz4 with byte shuffling for integers and booleans (ids,
    elements, pointers: they shrink many times over, cheaply), none for floats (they barely
    shrink); then a CRC-32C checksum, so a damaged chunk is an error on reading."""
    from zarr.codecs import BloscCodec, Crc32cCodec

    if dtype is not None and dtype.kind in "fc":
        return [Crc32cCodec()]
    itemsize = np.dtype(dtype if dtype is not None else np.int64).itemsize
    return [BloscCodec(cname="lz4", clevel=1, shuffle="shuffle", typesize=itemsize), Crc32cCodec()]


#: Every chunk is stored, even one equal to the fill value (zarr would compare each one with it).
_ARRAY_CONFIG: Any = {"write_empty_chunks": True}


def _raised_by_a_codec(exc: BaseException) -> bool:
    """Whether ``exc`` came out of numcodecs (its codecs raise plain RuntimeErrors on bad input)."""
    tb = exc.__traceback__
    while tb is not None:
        if "numcodecs" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def check_write_target(zarr_store: Any, where: str, folder: Path | None) -> None:
    """Refuse to write where a store cannot be, or where it would mix with someone else's data:
    a regular file, a folder that cannot be made, a folder of other files, a Zarr v2 group.
    ``folder`` is a local store's folder (made when absent), None for other stores.

    Raises:
        InvalidDataError: Naming the path, what is there and what to do.
    """
    import zarr

    new_path = "choose a new path for the store (a folder that does not exist yet), or the path of an alchemi store to continue it"
    if folder is None:
        try:
            found = zarr.open_group(zarr_store, mode="r")
        except Exception:  # noqa: BLE001 - nothing there yet (or nothing zarr reads): opening it decides
            return
        if found.metadata.zarr_format != 3:
            raise InvalidDataError(f"{where} holds a Zarr v{found.metadata.zarr_format} group, not an alchemi store; {new_path}")
        return
    if folder.exists() and not folder.is_dir():
        raise InvalidDataError(f"the store path {where} is a file, not a folder (a Zarr store is a folder); {new_path}")
    if not folder.exists():
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            pass  # another writer made it meanwhile
        except OSError as exc:
            raise InvalidDataError(
                f"cannot create the store folder {where}: {exc.strerror or exc}; choose a path in a folder you can write"
            ) from None
    names = sorted(p.name for p in folder.iterdir())
    if names and "zarr.json" not in names:
        what = ("a Zarr v2 group (.zgroup), not an alchemi store" if {".zgroup", ".zarray"} & set(names)
                else f"other files ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})")
        raise InvalidDataError(f"{where} holds {what}; alchemi writes a store only into a new or empty folder: {new_path}")


class AtomicStore:
    """An alchemi store opened for appending (``read_only=False``) or reading.

    Args:
        store: A path, an fsspec URL, a dict or a zarr store (see :func:`resolve_store`).
        read_only: Open for reading; the store must exist.
        storage_options: fsspec options for URLs.

    Raises:
        InvalidDataError: The store is not an alchemi store, is of a newer format, or is damaged
            (pointers that contradict the committed counts).
    """

    def __init__(self, store: Any, read_only: bool, storage_options: dict[str, Any] | None = None) -> None:
        import zarr

        self.read_only = read_only
        self.zarr_store, self.where, self._lock_path = resolve_store(store, read_only, storage_options)
        self.header: Header | None = None
        self.counts = (0, 0, 0)  # committed systems, atoms, edges
        self._arrays: dict[str, Any] = {}
        self._tails = ChunkTails()
        if read_only:
            self._group = self._open_group(zarr, "r")
        else:
            check_write_target(self.zarr_store, self.where, self._lock_path)
            # Locked: two writers creating one store would race (ContainsGroupError).
            with writer_lock(self.where, self._lock_path):
                self._group = self._open_group(zarr, "a")
                if layout.HEADER_KEY not in self._group.attrs:
                    self._initialise()
        self._load()

    def _open_group(self, zarr: Any, mode: str) -> Any:
        try:
            return zarr.open_group(self.zarr_store, mode=mode, zarr_format=3)
        except (FileNotFoundError, KeyError) as exc:  # zarr's GroupNotFoundError is one
            raise InvalidDataError(f"no alchemi store at {self.where}: {exc}") from None
        except Exception as exc:
            if not (type(exc).__module__.startswith("zarr.") or isinstance(exc, ValueError)):
                raise
            raise InvalidDataError(
                f"{self.where} is not an alchemi store, or a damaged one: its group metadata (zarr.json) is "
                f"unreadable or not a group's ({type(exc).__name__}: {exc})"
            ) from None

    def _initialise(self) -> None:
        """Mark an empty group as an alchemi store, or refuse a group that holds something else."""
        if "alchemi_sharded" in self._group.attrs:
            raise InvalidDataError(
                f"{self.where} is the root of a sharded results store (a data-parallel run's); open its "
                "records with alchemi_zarr.ShardedZarrReader (or open_reader) and write through ShardedZarrStore"
            )
        if any(True for _ in self._group.keys()) or self._group.attrs.asdict():
            raise InvalidDataError(
                f"{self.where} holds a Zarr group that is not an alchemi store; "
                "choose a new path for alchemi data"
            )
        self._group.attrs[layout.HEADER_KEY] = Header({}).to_json()

    def _load(self) -> None:
        """Read the header and the committed counts, and check they agree with the pointers."""
        attrs = self._group.attrs.asdict()
        if layout.HEADER_KEY not in attrs:
            hint = (" but the root of a sharded results store: read it with alchemi_zarr.ShardedZarrReader (or "
                    "open_reader)" if "alchemi_sharded" in attrs else f" (no {layout.HEADER_KEY!r} attribute)")
            raise InvalidDataError(f"{self.where} is not an alchemi store{hint}")
        header = Header.from_json(attrs[layout.HEADER_KEY], self.where)
        self._arrays = {}
        self._tails.forget()
        counts = self._read_commit()
        if counts[0] == 0:
            self._check_commit_not_lost()
            # An empty store's header was never committed: the first append decides the fields.
            self.header, self.counts = None, (0, 0, 0)
            return
        self.header = header
        self.counts = counts
        self._check_layout(header, counts)

    def _damaged(self, array: str, why: str) -> InvalidDataError:
        return InvalidDataError(
            f"{self.where} is damaged: array {array!r} {why}. Nothing was read or appended; restore the "
            "store from a copy, or write to a new store"
        )

    def _open_array(self, key: str) -> Any:
        """The zarr array at ``key``, or the damage that prevents opening it."""
        try:
            arr = self._group[key]
        except KeyError:
            raise self._damaged(key, "is missing") from None
        except Exception as exc:
            if not (type(exc).__module__.startswith("zarr.") or isinstance(exc, ValueError)):
                raise
            raise self._damaged(key, f"has unreadable metadata ({type(exc).__name__}: {exc})") from None
        if not hasattr(arr, "shape"):
            raise self._damaged(key, "is a group, not an array")
        return arr

    def _read_checked(self, key: str, arr: Any, start: int, stop: int) -> np.ndarray:
        try:
            return np.asarray(arr[start:stop])
        except Exception as exc:  # a chunk failing its CRC-32C, or one that will not decode
            if not (type(exc).__module__.split(".")[0] in ("zarr", "numcodecs") or isinstance(exc, ValueError)
                    or _raised_by_a_codec(exc)):
                raise
            raise self._damaged(key, f"has chunks that fail to decode ({type(exc).__name__}: {exc})") from None

    def _check_commit_not_lost(self) -> None:
        """An empty commit while the pointers hold records is a lost commit, not an empty store."""
        if layout.COMMIT not in self._group and layout.ATOM_PTR in self._group:
            rows = self._open_array(layout.ATOM_PTR).shape[0]
            if rows > 1:
                raise self._damaged(layout.COMMIT, f"is missing while {layout.ATOM_PTR!r} holds {rows - 1} systems")

    def _check_layout(self, header: Header, counts: tuple[int, int, int]) -> None:
        """Every array the header names exists with its dtype, row shape and enough rows, and the
        pointers end at the committed counts (and rise from 0, checked when opened for writing)."""
        systems = counts[0]
        for key, total in ((layout.ATOM_PTR, counts[1]), (layout.EDGE_PTR, counts[2])):
            arr = self._arrays[key] = self._open_array(key)
            if arr.ndim != 1 or np.dtype(arr.dtype) != np.int64:
                raise self._damaged(key, f"is {arr.dtype} of shape {list(arr.shape)}, not int64 [S + 1]")
            if arr.shape[0] < systems + 1:
                raise self._damaged(key, f"has {arr.shape[0]} rows but {systems} committed systems need {systems + 1}")
            first = 0 if not self.read_only else systems
            ptr = self._read_checked(key, arr, first, systems + 1).astype(np.int64)
            if not self.read_only and (ptr[0] != 0 or bool((np.diff(ptr) < 0).any())):
                at = 0 if ptr[0] != 0 else int(np.nonzero(np.diff(ptr) < 0)[0][0]) + 1
                raise self._damaged(key, f"does not rise from 0 (entry {at} is {int(ptr[at])})")
            if int(ptr[-1]) != total:
                raise self._damaged(key, f"ends at {int(ptr[-1])} but the commit records {total}")
        for name, spec in header.fields.items():
            key = f"{layout.LEVEL_GROUP[spec.level]}/{name}"
            arr = self._arrays[name] = self._open_array(key)
            want = layout.storage_dtype(spec.dtype)
            if np.dtype(arr.dtype) != want or tuple(arr.shape[1:]) != spec.shape:
                raise self._damaged(
                    key, f"is {arr.dtype} with rows {list(arr.shape[1:])} but the header records {spec.describe()}"
                )
            need = counts[_LEVEL_INDEX[spec.level]]
            if arr.shape[0] < need:
                raise self._damaged(key, f"has {arr.shape[0]} rows, fewer than the {need} committed")

    def _read_commit(self) -> tuple[int, int, int]:
        arr: Any = self._arrays.get(layout.COMMIT)
        if arr is None:
            if layout.COMMIT not in self._group:
                return (0, 0, 0)
            arr = self._arrays[layout.COMMIT] = self._open_array(layout.COMMIT)
        values = self._read_commit_chunk(arr)
        if values.shape != (3,) or np.any(values < 0):
            raise self._damaged(layout.COMMIT, f"holds {values.tolist()}, not three counts >= 0")
        return int(values[0]), int(values[1]), int(values[2])

    def _read_commit_chunk(self, arr: Any) -> np.ndarray:
        """The commit's three values: read directly on a local store (every append reads it)."""
        try:
            direct = read_local_chunk(arr, 0) if arr.shape == (3,) and arr.chunks == (3,) else None
        except ValueError as exc:  # a damaged commit chunk, as zarr's read reports one
            raise self._damaged(layout.COMMIT, f"has chunks that fail to decode (ValueError: {exc})") from None
        if direct is not None:
            return direct.astype(np.int64)
        return self._read_checked(layout.COMMIT, arr, 0, 3).astype(np.int64)

    def refresh(self) -> bool:
        """Pick up records another writer committed since; True when there were any."""
        counts = self._read_commit()
        if counts == self.counts:
            return False
        import zarr

        # Reopen: the header may have changed too (a cleared store that took new fields).
        self._group = zarr.open_group(self.zarr_store, mode="r" if self.read_only else "a", zarr_format=3)
        self._load()
        return True

    @property
    def num_systems(self) -> int:
        return self.counts[0]

    @property
    def num_atoms(self) -> int:
        return self.counts[1]

    @property
    def num_edges(self) -> int:
        return self.counts[2]

    def array(self, name: str) -> Any:
        """The zarr array of field (or pointer) ``name``."""
        arr = self._arrays.get(name)
        if arr is None:
            if name in (layout.ATOM_PTR, layout.EDGE_PTR, layout.COMMIT):
                arr = self._group[name]
            else:
                assert self.header is not None
                arr = self._group[f"{layout.LEVEL_GROUP[self.header.fields[name].level]}/{name}"]
            self._arrays[name] = arr
        return arr

    def pointers(self, start: int = 0, stop: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``atom_ptr[start:stop+1]`` and ``edge_ptr[start:stop+1]`` of committed systems."""
        stop = self.num_systems if stop is None else stop
        if self.num_systems == 0:
            return np.zeros(1, np.int64), np.zeros(1, np.int64)
        return (
            self.read_rows(layout.ATOM_PTR, start, stop + 1).astype(np.int64, copy=False),
            self.read_rows(layout.EDGE_PTR, start, stop + 1).astype(np.int64, copy=False),
        )

    def read_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of field (or pointer) ``name``.

        Raises:
            InvalidDataError: A chunk fails its checksum or does not decode (naming the store and
                the array).
        """
        arr = self.array(name)
        return self._read_checked(arr.path, arr, start, stop)

    def read_batch(self, start: int, stop: int, device: torch.device | str = "cpu") -> Batch:
        """Committed systems ``start:stop`` as one batch (one read per field).

        Raises:
            InvalidDataError: A record that is not a valid structure (see
                :func:`~alchemi_zarr.validity.check_records`).
        """
        if not 0 <= start <= stop <= self.num_systems:
            raise IndexError(f"systems {start}:{stop} out of range for a store of {self.num_systems}")
        assert self.header is not None
        atom_ptr, edge_ptr = self.pointers(start, stop)
        num_atoms, num_edges = np.diff(atom_ptr), np.diff(edge_ptr)
        bounds = {Level.SYSTEM: (start, stop), Level.NODE: (atom_ptr[0], atom_ptr[-1]),
                  Level.EDGE: (edge_ptr[0], edge_ptr[-1])}
        local = {}
        for name, spec in self.header.fields.items():
            lo, hi = bounds[spec.level]
            local[name] = to_tensor(self.read_rows(name, int(lo), int(hi)), spec.dtype)
        check_records(local, num_atoms, num_edges, start, self.where)
        fields = {
            name: torch.from_numpy(to_batch_indices(t.numpy(), num_atoms, num_edges)) if name in INDEX_FIELDS else t
            for name, t in local.items()
        }
        levels = {k: v.level for k, v in self.header.fields.items()}
        return Batch.from_segments(fields, levels, num_atoms, num_edges, device=device)

    def read_structure(self, rows: Mapping[str, np.ndarray], index: int) -> AtomicData:
        """One structure from its rows (local indices), checked as :meth:`read_batch` checks records.

        Raises:
            InvalidDataError: The stored record is not a valid structure (the message names it).
        """
        assert self.header is not None
        fields = {name: to_tensor(a, self.header.fields[name].dtype) for name, a in rows.items()}
        counts = {spec.level: len(rows[name]) for name, spec in self.header.fields.items()}
        check_records(fields, np.array([counts.get(Level.NODE, 0)]), np.array([counts.get(Level.EDGE, 0)]), index,
                      self.where)
        levels = {k: v.level.value for k, v in self.header.fields.items()}
        try:
            return AtomicData(levels=levels, **fields)
        except InvalidDataError as exc:
            raise InvalidDataError(f"record {index} of {self.where} is not a valid structure: {exc}") from None

    def append(self, records: HostRecords) -> None:
        """Store ``records`` after the committed ones, committing them last.

        Raises:
            InvalidDataError: The records' fields differ from the store's.
        """
        if self.read_only:
            raise InvalidDataError(f"{self.where} was opened for reading; open a writer to append")
        if records.num_systems == 0:
            return
        with writer_lock(self.where, self._lock_path):
            self.refresh()  # another writer may have appended since
            if self.num_systems == 0:
                self._create_arrays(records.specs)
            else:
                assert self.header is not None
                why = self.header.mismatch(records.specs)
                if why:
                    raise InvalidDataError(
                        f"cannot append to {self.where}: {why}. Every record of a store has the same "
                        "fields; write these systems to a new store"
                    )
            self._write(records)

    def _create_arrays(self, specs: Mapping[str, FieldSpec]) -> None:
        """Lay out an empty store for records with ``specs`` (replacing any uncommitted arrays)."""
        header = Header(dict(specs))
        self._group.attrs[layout.HEADER_KEY] = header.to_json()
        groups = {}
        for lvl, name in layout.LEVEL_GROUP.items():
            if name in self._group:  # arrays of an uncommitted or cleared schema: nothing to keep
                del self._group[name]
            groups[lvl] = self._group.create_group(name)
        self._arrays = {}
        self._tails.forget()
        for name, spec in specs.items():
            rows = layout.chunk_rows(spec.row_bytes)
            self._arrays[name] = groups[spec.level].create_array(
                name,
                shape=(0, *spec.shape),
                dtype=layout.storage_dtype(spec.dtype),
                chunks=(rows, *spec.shape),
                compressors=_compressors(layout.storage_dtype(spec.dtype)),
                config=_ARRAY_CONFIG,
                fill_value=0,
                attributes={"level": spec.level.value, "dtype": layout.dtype_name(spec.dtype, name), "units": spec.units},
                overwrite=True,
            )
        for name in (layout.ATOM_PTR, layout.EDGE_PTR):
            self._arrays[name] = self._group.create_array(
                name, shape=(1,), dtype=np.int64, chunks=(layout.POINTER_CHUNK_ROWS,),
                compressors=_compressors(), config=_ARRAY_CONFIG, fill_value=0, overwrite=True,
            )
        if layout.COMMIT not in self._group:
            self._group.create_array(layout.COMMIT, shape=(3,), dtype=np.int64, chunks=(3,), fill_value=0)
        self.header = header

    def _write(self, records: HostRecords) -> None:
        assert self.header is not None
        s0, n0, e0 = self.counts
        k, n, e = records.num_systems, int(records.num_atoms.sum()), int(records.num_edges.sum())
        start = {Level.SYSTEM: s0, Level.NODE: n0, Level.EDGE: e0}
        writes: list[tuple[str, int, np.ndarray]] = []
        for name, spec in self.header.fields.items():
            writes.append((name, start[spec.level], records.fields[name]))
        for name, first, counts in ((layout.ATOM_PTR, n0, records.num_atoms), (layout.EDGE_PTR, e0, records.num_edges)):
            writes.append((name, s0 + 1, first + np.cumsum(counts, dtype=np.int64)))
        pieces: list[tuple[Any, slice, np.ndarray]] = []
        committed: dict[str, int] = {}  # rows of each array that hold records: chunks past them are fresh
        for name, lo, rows in writes:
            arr = self.array(name)
            chunk = arr.chunks[0]
            self._grow(name, ChunkTails.end(lo + len(rows), chunk))
            committed[arr.path] = lo
            for first, values in self._tails.pieces(name, lo, rows, chunk, functools.partial(_rows, arr)):
                pieces.append((arr, slice(first, first + len(values)), values))
        write_pieces(pieces, committed)
        # The commit point, after every data write has returned; its one chunk is replaced whole.
        commit = self.array(layout.COMMIT)
        write_pieces([(commit, slice(0, 3), np.array([s0 + k, n0 + n, e0 + e], dtype=np.int64))])
        self.counts = (s0 + k, n0 + n, e0 + e)

    def _grow(self, name: str, rows: int) -> None:
        arr = self.array(name)
        have = arr.shape[0]
        if rows > have:
            # Geometric growth keeps metadata rewrites rare; rows past the commit are not records.
            arr.resize((max(rows, 2 * have, arr.chunks[0]), *arr.shape[1:]))

    def truncate(self, num_systems: int) -> None:
        """Keep the first ``num_systems`` records and forget the rest (a checkpoint's resume); only
        the commit changes.

        Raises:
            InvalidDataError: The store holds fewer records than ``num_systems``.
        """
        with writer_lock(self.where, self._lock_path):
            self.refresh()
            if num_systems > self.num_systems:
                raise InvalidDataError(
                    f"{self.where} holds {self.num_systems} records, fewer than the {num_systems} to keep"
                )
            if num_systems == self.num_systems:
                return
            atoms, edges = (int(p[0]) for p in self.pointers(num_systems, num_systems))
            self.array(layout.COMMIT)[:] = np.array([num_systems, atoms, edges], dtype=np.int64)
            self.counts = (num_systems, atoms, edges)
            self._tails.forget()
            if num_systems == 0:
                self.header = None
                self._arrays = {}

    def clear(self) -> None:
        """Forget every record: commit zero first, then drop the arrays to free their space."""
        with writer_lock(self.where, self._lock_path):
            if layout.COMMIT in self._group:
                self.array(layout.COMMIT)[:] = np.zeros(3, dtype=np.int64)
            self.counts = (0, 0, 0)
            self._tails.forget()
            for name in (*layout.LEVEL_GROUP.values(), layout.ATOM_PTR, layout.EDGE_PTR):
                if name in self._group:
                    del self._group[name]
            self._group.attrs[layout.HEADER_KEY] = Header({}).to_json()
            self._arrays = {}
            self.header = None

    def __repr__(self) -> str:
        return f"AtomicStore({self.where!r}, systems={self.num_systems}, read_only={self.read_only})"


def _rows(arr: Any, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of a Zarr array."""
    return np.asarray(arr[start:stop])
