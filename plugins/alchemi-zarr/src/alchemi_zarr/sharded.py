"""One results store for many writing processes: a root group whose parts are alchemi stores.

A data-parallel run (``alchemi_core.parallel``) gives rank *r* its own part, ``<root>/part-0000r``:
an ordinary alchemi store (docs/storage.md) that only that rank appends to, so no lock is needed
and a killed rank leaves its committed records intact. :mod:`alchemi_zarr.sharded_store` is what the
ranks write through; :class:`ShardedZarrReader` reads the union of the parts as one dataset (the
interface of ``AtomicDataZarrReader``), and :func:`open_reader` opens a root or a single store
alike. The root is a Zarr group marked by its attribute ``alchemi_sharded``; parts are found by
listing it, so a rerun with another number of ranks reads every part already there.

Example:
    >>> from alchemi_core.testing import make_batch
    >>> from alchemi_zarr import ShardedZarrStore
    >>> root = ShardedZarrStore("memory://sharded-doc")
    >>> root.sink(0).write(make_batch([3, 2]))
    >>> root.sink(1).write(make_batch([4]))
    >>> reader = open_reader("memory://sharded-doc")
    >>> type(reader).__name__, len(reader), reader.read_batch().num_nodes
    ('ShardedZarrReader', 3, 9)
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from alchemi_core.data import AtomicData, Batch
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_zarr import layout
from alchemi_zarr.reader import AtomicDataZarrReader
from alchemi_zarr.storage import AtomicStore, check_write_target

SHARDED_KEY = "alchemi_sharded"
SHARDED_FORMAT: dict[str, Any] = {"format": "alchemi.sharded", "version": 1}
PART_PREFIX = "part-"


def part_name(rank: int) -> str:
    """The part rank ``rank`` writes: ``part-00003``."""
    return f"{PART_PREFIX}{int(rank):05d}"


def root_text(root: str | os.PathLike[str]) -> str:
    """The root as a path or URL string."""
    if isinstance(root, os.PathLike):
        return os.fspath(root)
    if not isinstance(root, str):
        raise ConfigurationError(
            f"a sharded results store needs a path or a URL (its parts live under it), got {type(root).__name__}"
        )
    return root


def join_part(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}" if "://" in root else str(Path(root) / name)


#: Opens of the root a rank tries while other ranks are creating it at the same moment.
_CREATE_ATTEMPTS = 5


def open_root(root: str, create: bool, storage_options: dict[str, Any] | None) -> Any:
    import zarr
    from zarr.errors import ContainsGroupError

    from alchemi_zarr.stores import resolve_store

    store, where, folder = resolve_store(root, read_only=not create, storage_options=storage_options)
    if create:
        check_write_target(store, where, folder)
    for attempt in range(_CREATE_ATTEMPTS):
        try:
            group = zarr.open_group(store, mode="a" if create else "r", zarr_format=3)
            break
        except (FileNotFoundError, KeyError) as exc:
            raise InvalidDataError(f"no sharded results store at {where}: {exc}") from None
        except ContainsGroupError:
            # Every rank opens the root at once: two may both find it absent, and the second to
            # create it is told it exists. Opening it again finds the first one's group.
            if not create or attempt == _CREATE_ATTEMPTS - 1:
                raise
            time.sleep(0.01 * (attempt + 1))
    attrs: dict[str, Any] = dict(group.attrs.asdict())
    if layout.HEADER_KEY in attrs:
        raise InvalidDataError(
            f"{where} is a single alchemi store, not the root of a sharded one; read it with "
            "AtomicDataZarrReader, or give the data-parallel run a new path"
        )
    if SHARDED_KEY not in attrs:
        # Ranks open the root at once: one's creation may overwrite another's mark. A group of
        # parts and nothing else is a root all the same, and a writer marks it again.
        names = list(group.keys())
        if any(not n.startswith(PART_PREFIX) for n in names):
            raise InvalidDataError(f"{where} holds a Zarr group that is not an alchemi store; choose a new path")
        if create:
            group.attrs[SHARDED_KEY] = SHARDED_FORMAT
        elif not names:
            raise InvalidDataError(f"{where} is not a sharded alchemi results store (no {SHARDED_KEY!r} attribute)")
    elif int(dict(attrs[SHARDED_KEY]).get("version", 0)) > int(SHARDED_FORMAT["version"]):
        raise InvalidDataError(f"{where} is a sharded store of a newer version; upgrade alchemi-zarr")
    return group


def is_sharded(root: Any, storage_options: dict[str, Any] | None = None) -> bool:
    """True when ``root`` is the root of a sharded results store."""
    if not isinstance(root, str | os.PathLike):
        return False
    try:
        open_root(root_text(root), False, storage_options)
    except Exception:  # noqa: BLE001 - not a readable root; opened as a single store, the damage is named
        return False
    return True


def part_names(group: Any) -> list[str]:
    return sorted(k for k in group.group_keys() if k.startswith(PART_PREFIX))


def column_of(part: AtomicStore, name: str) -> np.ndarray:
    if part.num_systems == 0:
        return np.zeros(0, dtype=np.int64)
    if part.header is None or name not in part.header.fields:
        raise InvalidDataError(f"{part.where} holds records without {name}; a results store needs them")
    return np.asarray(part.read_rows(name, 0, part.num_systems), dtype=np.int64).reshape(-1)



class ShardedZarrReader:
    """Every part of a sharded results store as one dataset (the interface of
    ``AtomicDataZarrReader``): part 0's records first, then part 1's, ...

    Args:
        root: The root path or URL.
        storage_options: fsspec options for URLs.
        cache_chunks: Decoded chunks kept per field and part.
    """

    def __init__(self, root: str | os.PathLike[str], storage_options: dict[str, Any] | None = None,
                 cache_chunks: int = 4) -> None:
        self.root = root_text(root)
        self.storage_options = storage_options
        self.cache_chunks = int(cache_chunks)
        self._open()

    def _open(self) -> None:
        group = open_root(self.root, False, self.storage_options)
        self.parts = [
            AtomicDataZarrReader(join_part(self.root, name), storage_options=self.storage_options,
                                 cache_chunks=self.cache_chunks)
            for name in part_names(group)
        ]
        self._offsets = np.cumsum([0] + [len(p) for p in self.parts]).astype(np.int64)

    def refresh(self) -> int:
        """Pick up parts and records committed since opening; returns the new length."""
        self._open()
        return len(self)

    def __len__(self) -> int:
        return int(self._offsets[-1])

    @property
    def fields(self) -> dict[str, dict[str, Any]]:
        """The fields of the first part that holds records."""
        for part in self.parts:
            if len(part):
                return part.fields
        return {}

    def _locate(self, index: int) -> tuple[AtomicDataZarrReader, int]:
        n = len(self)
        i = int(index)
        if not -n <= i < n:
            raise IndexError(f"index {index} out of range for a store of {n} structures ({self.root})")
        i = i + n if i < 0 else i
        k = int(np.searchsorted(self._offsets, i, side="right")) - 1
        return self.parts[k], i - int(self._offsets[k])

    def get_metadata(self, index: int) -> tuple[int, int]:
        part, i = self._locate(index)
        return part.get_metadata(i)

    def get_all_metadata(self) -> tuple[np.ndarray, np.ndarray]:
        metas = [p.get_all_metadata() for p in self.parts]
        if not metas:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate([m[0] for m in metas]), np.concatenate([m[1] for m in metas])

    @property
    def where(self) -> str:
        """The root, as messages name it."""
        return self.root

    def system_ids(self) -> np.ndarray:
        """The ``system_id`` of every record, in reader order."""
        ids = [column_of(p.store, "system_id") for p in self.parts]
        return np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)

    get_all_system_ids = system_ids

    def column(self, name: str) -> np.ndarray:
        """Every record's rows of system field ``name`` (e.g. ``energy``), in reader order."""
        rows = [np.asarray(p.store.read_rows(name, 0, p.store.num_systems)) for p in self.parts if len(p)]
        return np.concatenate(rows) if rows else np.zeros(0)

    def __getitem__(self, index: int) -> AtomicData:
        part, i = self._locate(index)
        return part[i]

    def __iter__(self) -> Iterator[AtomicData]:
        for part in self.parts:
            yield from part

    def read_batch(self, start: int = 0, stop: int | None = None, device: torch.device | str = "cpu") -> Batch:
        """Records ``start:stop`` (reader order) as one batch, one read per field and part."""
        stop = len(self) if stop is None else min(int(stop), len(self))
        out: Batch | None = None
        for k, part in enumerate(self.parts):
            lo, hi = int(self._offsets[k]), int(self._offsets[k + 1])
            a, b = max(start, lo), min(stop, hi)
            if a >= b:
                continue
            piece = part.read_batch(a - lo, b - lo, device=device)
            out = piece if out is None else out.append(piece)
        if out is None:
            raise IndexError(f"records {start}:{stop} are empty in {self.root} ({len(self)} records)")
        return out.trim()

    def to_extxyz(self, path: str | Path, **kwargs: Any) -> int:
        """Write every record to an extended XYZ file (see ``alchemi_zarr.extxyz.write_extxyz``)."""
        from alchemi_zarr.extxyz import write_extxyz

        return write_extxyz(self, path, **kwargs)

    def __repr__(self) -> str:
        return f"ShardedZarrReader({self.root!r}, {len(self.parts)} parts, {len(self)} structures)"


def open_reader(store: Any, storage_options: dict[str, Any] | None = None) -> AtomicDataZarrReader | ShardedZarrReader:
    """A reader of ``store``: a single alchemi store or the root of a sharded one."""
    if is_sharded(store, storage_options):
        return ShardedZarrReader(store, storage_options=storage_options)
    return AtomicDataZarrReader(store, storage_options=storage_options)
