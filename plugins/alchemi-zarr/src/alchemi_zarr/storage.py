"""``AtomicStore``: one alchemi Zarr store (layout in :mod:`alchemi_zarr.layout`), appended to
whole records at a time and read by row ranges.

An append writes, in this order: the header (only into an empty store), any array growth
(metadata), the data rows and the pointers past the committed end, and last the ``commit``
array. Every store write replaces one object atomically, so a crash at any point leaves the old
commit, whose records are untouched (rows sharing a chunk with new rows are rewritten with their
old values, all or nothing); the uncommitted tail is ignored on reopening and overwritten by the
next append.

Example:
    >>> from alchemi_core.testing import make_batch
    >>> from alchemi_zarr.records import HostRecords, snapshot
    >>> store = AtomicStore("memory://storage-doc", read_only=False)
    >>> store.append(HostRecords.from_snapshot(snapshot(make_batch([3, 2]), copy=False)))
    >>> store.num_systems, store.num_atoms, store.pointers()[0].tolist()
    (2, 5, [0, 3, 5])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from alchemi_core.data import AtomicData, Batch
from alchemi_core.data.fields import INDEX_FIELDS, Level
from alchemi_core.errors import InvalidDataError

from alchemi_zarr import layout
from alchemi_zarr.aligned import ChunkTails
from alchemi_zarr.chunks import write_pieces
from alchemi_zarr.layout import FieldSpec, Header
from alchemi_zarr.records import HostRecords, to_batch_indices, to_tensor
from alchemi_zarr.stores import resolve_store, writer_lock

_LEVEL_INDEX = {Level.SYSTEM: 0, Level.NODE: 1, Level.EDGE: 2}


def _compressors(dtype: np.dtype | None = None) -> Any:
    """Codecs of one array: for integers and booleans (ids, elements, flags, pointers) blosc's
    lz4 with byte shuffling (they shrink 20-200x at ~5 GB/s; numcodecs' plain zstd took 1.2 ms
    per 512 KiB chunk, a quarter of a snapshot's write), then a CRC-32C checksum; for floats the
    checksum alone (trajectory floats shrink ~10 % under zstd for a third of the write time).
    Either way a damaged chunk is an error on reading instead of wrong numbers."""
    from zarr.codecs import BloscCodec, Crc32cCodec

    if dtype is not None and dtype.kind in "fc":
        return [Crc32cCodec()]
    itemsize = np.dtype(dtype if dtype is not None else np.int64).itemsize
    return [BloscCodec(cname="lz4", clevel=1, shuffle="shuffle", typesize=itemsize), Crc32cCodec()]


#: Every chunk is stored, even one equal to the fill value: zarr would otherwise compare each
#: chunk with it, a pass over all the data, to save space only for all-zero chunks.
_ARRAY_CONFIG = {"write_empty_chunks": True}


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
        try:
            self._group = zarr.open_group(self.zarr_store, mode="r" if read_only else "a", zarr_format=3)
        except (FileNotFoundError, KeyError) as exc:  # zarr's GroupNotFoundError is one
            raise InvalidDataError(f"no alchemi store at {self.where}: {exc}") from None
        except Exception as exc:
            if not type(exc).__module__.startswith("zarr."):
                raise
            # An array where the group should be, unreadable metadata: zarr's own complaints.
            raise InvalidDataError(f"{self.where} is not an alchemi store: {exc}") from exc
        self.header: Header | None = None
        self.counts = (0, 0, 0)  # committed systems, atoms, edges
        self._arrays: dict[str, Any] = {}
        self._tails = ChunkTails()
        if not read_only and layout.HEADER_KEY not in self._group.attrs:
            self._initialise()
        self._load()

    # ------------------------------------------------------------------ opening
    def _initialise(self) -> None:
        """Mark an empty group as an alchemi store, or refuse a group that holds something else."""
        if "alchemi_sharded" in self._group.attrs:
            raise InvalidDataError(
                f"{self.where} is the root of a sharded results store (a data-parallel run's); open its "
                "records with alchemi_zarr.ShardedZarrReader (or open_reader) and write through ShardedZarrStore"
            )
        if any(True for _ in self._group.keys()):
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
        counts = self._read_commit()
        self._arrays = {}
        self._tails.forget()
        if counts[0] == 0:
            # Whatever an empty store's header says was never committed (a crashed first append,
            # a cleared store): there are no fields yet, and the first append decides them.
            self.header, self.counts = None, (0, 0, 0)
            return
        self.header = header
        self.counts = counts
        atom_end, edge_end = (int(p[0]) for p in self.pointers(counts[0], counts[0]))
        if (atom_end, edge_end) != counts[1:]:
            raise InvalidDataError(
                f"{self.where} is damaged: its pointers end at {atom_end} atoms and {edge_end} "
                f"edges but it committed {counts[1]} and {counts[2]}"
            )
        for name, spec in header.fields.items():
            rows = self.array(name).shape[0]
            if rows < counts[_LEVEL_INDEX[spec.level]]:
                raise InvalidDataError(f"{self.where} is damaged: field {name!r} has {rows} rows, fewer than committed")

    def _read_commit(self) -> tuple[int, int, int]:
        arr = self._arrays.get(layout.COMMIT)
        if arr is None:
            try:
                arr = self._arrays[layout.COMMIT] = self._group[layout.COMMIT]
            except KeyError:
                return (0, 0, 0)
        values = np.asarray(arr[:], dtype=np.int64)
        if values.shape != (3,) or np.any(values < 0):
            raise InvalidDataError(f"{self.where} is damaged: commit record {values.tolist()}")
        return int(values[0]), int(values[1]), int(values[2])

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

    # ------------------------------------------------------------------ sizes and access
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
            np.asarray(self.array(layout.ATOM_PTR)[start : stop + 1], dtype=np.int64),
            np.asarray(self.array(layout.EDGE_PTR)[start : stop + 1], dtype=np.int64),
        )

    def read_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        return np.asarray(self.array(name)[start:stop])

    def read_batch(self, start: int, stop: int, device: torch.device | str = "cpu") -> Batch:
        """Committed systems ``start:stop`` as one batch (one read per field)."""
        if not 0 <= start <= stop <= self.num_systems:
            raise IndexError(f"systems {start}:{stop} out of range for a store of {self.num_systems}")
        assert self.header is not None
        atom_ptr, edge_ptr = self.pointers(start, stop)
        num_atoms, num_edges = np.diff(atom_ptr), np.diff(edge_ptr)
        bounds = {Level.SYSTEM: (start, stop), Level.NODE: (atom_ptr[0], atom_ptr[-1]),
                  Level.EDGE: (edge_ptr[0], edge_ptr[-1])}
        fields = {}
        for name, spec in self.header.fields.items():
            lo, hi = bounds[spec.level]
            rows = self.read_rows(name, int(lo), int(hi))
            if name in INDEX_FIELDS:
                rows = to_batch_indices(rows, num_atoms, num_edges)
            fields[name] = to_tensor(rows, spec.dtype)
        levels = {k: v.level for k, v in self.header.fields.items()}
        return Batch.from_segments(fields, levels, num_atoms, num_edges, device=device)

    def read_structure(self, rows: Mapping[str, np.ndarray], index: int) -> AtomicData:
        """One structure from its rows (local indices), validated like any new ``AtomicData``.

        Raises:
            InvalidDataError: The stored record is not a valid structure (the message names it).
        """
        assert self.header is not None
        fields = {name: to_tensor(a, self.header.fields[name].dtype) for name, a in rows.items()}
        levels = {k: v.level.value for k, v in self.header.fields.items()}
        try:
            return AtomicData(levels=levels, **fields)
        except InvalidDataError as exc:
            raise InvalidDataError(f"record {index} of {self.where} is not a valid structure: {exc}") from None

    # ------------------------------------------------------------------ appending
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
        for name, lo, rows in writes:
            arr = self.array(name)
            chunk = arr.chunks[0]
            self._grow(name, ChunkTails.end(lo + len(rows), chunk))
            for first, values in self._tails.pieces(name, lo, rows, chunk, self._reader(arr)):
                pieces.append((arr, slice(first, first + len(values)), values))
        write_pieces(pieces)
        # The commit point, after every data write has returned: before it, a reader (or a
        # reopened writer) sees none of these records.
        self.array(layout.COMMIT)[:] = np.array([s0 + k, n0 + n, e0 + e], dtype=np.int64)
        self.counts = (s0 + k, n0 + n, e0 + e)

    @staticmethod
    def _reader(arr: Any) -> Any:
        return lambda start, stop: arr[start:stop]

    def _grow(self, name: str, rows: int) -> None:
        arr = self.array(name)
        have = arr.shape[0]
        if rows > have:
            # Geometric growth keeps metadata rewrites rare; rows past the commit are not records.
            arr.resize((max(rows, 2 * have, arr.chunks[0]), *arr.shape[1:]))

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
