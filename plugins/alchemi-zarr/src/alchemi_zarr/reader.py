"""``AtomicDataZarrReader``: random access to the structures of an alchemi Zarr store.

Opening reads the committed count and the per-system pointers only, so ``get_metadata(i)`` and
``get_all_metadata()`` cost no data reads (``SizeAwareSampler`` plans over stores larger than
memory). ``reader[i]`` reads through a small cache of decoded chunks.

Example:
    >>> from alchemi_core.testing import random_structures
    >>> from alchemi_zarr import AtomicDataZarrReader, AtomicDataZarrWriter
    >>> AtomicDataZarrWriter("memory://reader-doc").write(random_structures([3, 5, 2]))
    3
    >>> reader = AtomicDataZarrReader("memory://reader-doc")
    >>> len(reader), reader.get_metadata(1), reader[1].num_nodes
    (3, (5, 0), 5)
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from alchemi_core.data import AtomicData, Batch
from alchemi_core.data.fields import Level
from alchemi_core.errors import InvalidDataError
from alchemi_zarr.storage import AtomicStore


def _read_block(store: AtomicStore, limits: dict[str, int], name: str, k: int) -> np.ndarray:
    """Chunk ``k`` of field ``name``, decoded (only its committed rows)."""
    b = store.array(name).chunks[0]
    return store.read_rows(name, k * b, min((k + 1) * b, limits[name]))


class AtomicDataZarrReader:
    """Structures of an alchemi Zarr store, by index (what ``Dataset`` and ``SizeAwareSampler``
    need: ``len``, ``reader[i]``, ``get_metadata(i)``, ``get_all_metadata()``).

    Args:
        store: A path, an fsspec URL, a dict or a zarr store written by ``ZarrData`` or
            ``AtomicDataZarrWriter``.
        storage_options: fsspec options for URLs.
        cache_chunks: Decoded chunks kept per field (up to 512 KiB each).

    Raises:
        InvalidDataError: No alchemi store there, or a damaged one.
    """

    def __init__(self, store: Any, storage_options: dict[str, Any] | None = None, cache_chunks: int = 4) -> None:
        self.store = AtomicStore(store, read_only=True, storage_options=storage_options)
        self.cache_chunks = int(cache_chunks)
        self._load_pointers()

    def _load_pointers(self) -> None:
        atom_ptr, edge_ptr = self.store.pointers()
        if np.any(np.diff(atom_ptr) < 0) or np.any(np.diff(edge_ptr) < 0) or atom_ptr[0] != 0 or edge_ptr[0] != 0:
            raise InvalidDataError(f"{self.store.where} is damaged: its pointers are not non-decreasing from 0")
        self._atom_ptr, self._edge_ptr = atom_ptr, edge_ptr
        limits = {Level.SYSTEM: self.store.num_systems, Level.NODE: self.store.num_atoms, Level.EDGE: self.store.num_edges}
        fields = self.store.header.fields if self.store.header is not None else {}
        self._limits = {name: limits[spec.level] for name, spec in fields.items()}  # committed rows
        # Decoded chunks, least recently used dropped first (no reference back to the reader).
        self._block = functools.lru_cache(maxsize=max(1, self.cache_chunks * len(fields)))(
            functools.partial(_read_block, self.store, self._limits))

    def _rows(self, name: str, lo: int, hi: int) -> np.ndarray:
        arr = self.store.array(name)
        if hi <= lo:
            return np.empty((0, *arr.shape[1:]), dtype=arr.dtype)
        b = arr.chunks[0]
        parts = [self._block(name, k)[max(lo - k * b, 0) : hi - k * b] for k in range(lo // b, (hi - 1) // b + 1)]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def refresh(self) -> int:
        """Pick up records committed since opening; returns the new length."""
        if self.store.refresh():
            self._load_pointers()
        return len(self)

    def __len__(self) -> int:
        return self.store.num_systems

    @property
    def fields(self) -> dict[str, dict[str, Any]]:
        """Each field's level, dtype, trailing shape and units, as recorded in the store."""
        header = self.store.header
        return {} if header is None else {k: v.to_json() for k, v in header.fields.items()}

    def _index(self, index: int) -> int:
        n = len(self)
        i = int(index)
        if not -n <= i < n:
            raise IndexError(f"index {index} out of range for a store of {n} structures ({self.store.where})")
        return i + n if i < 0 else i

    def get_metadata(self, index: int) -> tuple[int, int]:
        """``(num_atoms, num_edges)`` of structure ``index``, from the pointers alone."""
        i = self._index(index)
        return int(self._atom_ptr[i + 1] - self._atom_ptr[i]), int(self._edge_ptr[i + 1] - self._edge_ptr[i])

    def get_all_metadata(self) -> tuple[np.ndarray, np.ndarray]:
        """Atoms and edges of every structure, as two int64 arrays."""
        return np.diff(self._atom_ptr), np.diff(self._edge_ptr)

    @property
    def where(self) -> str:
        """The store, as messages name it."""
        return self.store.where

    def column(self, name: str) -> np.ndarray:
        """Every record's rows of system field ``name`` (e.g. ``energy``), in reader order."""
        return self.store.read_rows(name, 0, len(self))

    def get_all_system_ids(self) -> np.ndarray:
        """Every structure's ``system_id`` (one read of that field), or its index when the store
        has no such field."""
        header = self.store.header
        if header is None or "system_id" not in header.fields:
            return np.arange(len(self), dtype=np.int64)
        return self.store.read_rows("system_id", 0, len(self)).reshape(len(self), -1)[:, 0].astype(np.int64)

    def __getitem__(self, index: int) -> AtomicData:
        """Structure ``index`` with every stored field (neighbour indices local to it).

        Raises:
            IndexError: Out of range.
            InvalidDataError: The stored record is not a valid structure.
        """
        i = self._index(index)
        header = self.store.header
        assert header is not None
        bounds = {
            Level.SYSTEM: (i, i + 1),
            Level.NODE: (int(self._atom_ptr[i]), int(self._atom_ptr[i + 1])),
            Level.EDGE: (int(self._edge_ptr[i]), int(self._edge_ptr[i + 1])),
        }
        rows = {name: self._rows(name, *bounds[spec.level]) for name, spec in header.fields.items()}
        return self.store.read_structure(rows, i)

    def __iter__(self) -> Iterator[AtomicData]:
        for i in range(len(self)):
            yield self[i]

    def read_batch(self, start: int = 0, stop: int | None = None, device: torch.device | str = "cpu") -> Batch:
        """Structures ``start:stop`` as one batch, one read per field."""
        stop = len(self) if stop is None else min(int(stop), len(self))
        return self.store.read_batch(int(start), stop, device=device)

    def to_extxyz(self, path: str | Path, **kwargs: Any) -> int:
        """Write the structures to an extended XYZ file (see ``alchemi_zarr.extxyz.write_extxyz``)."""
        from alchemi_zarr.extxyz import write_extxyz

        return write_extxyz(self, path, **kwargs)

    def __repr__(self) -> str:
        return f"AtomicDataZarrReader({self.store.where!r}, {len(self)} structures)"
