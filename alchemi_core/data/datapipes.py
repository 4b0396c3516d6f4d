"""Datasets the dynamics engine streams structures from.

A dataset has ``__len__``, ``__getitem__(i)`` returning an ``AtomicData`` (an ``(AtomicData,
metadata)`` pair is accepted too) and ``get_metadata(i)`` returning ``(num_atoms, num_edges)``
cheaply, without loading the structure; ``get_all_metadata()``, when present, returns both for
every structure at once. :class:`Dataset` wraps any *reader* with that shape and moves
structures to a device; :class:`ListDataset` holds structures in memory.

``AtomicDataZarrReader`` and ``AtomicDataZarrWriter`` come from the ``alchemi-zarr`` plugin and
import from here when it is installed.

Example:
    >>> import torch
    >>> from alchemi_core.data import AtomicData
    >>> from alchemi_core.data.datapipes import ListDataset
    >>> ds = ListDataset([AtomicData(atomic_numbers=torch.tensor([1, 1]), positions=torch.zeros(2, 3))])
    >>> len(ds), ds.get_metadata(0)
    (1, (2, 0))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from alchemi_core.data.ase_io import INFO_PREFIX, JSON_PREFIX, SYSTEM_INFO, TEXT_PREFIX, harmonise
from alchemi_core.data.atomic_data import AtomicData
from alchemi_core.data.fields import KNOWN_LEVELS
from alchemi_core.errors import InvalidDataError

#: Prefixes of the system fields that hold ``atoms.info`` values.
INFO_PREFIXES = (INFO_PREFIX, TEXT_PREFIX, JSON_PREFIX)


def as_atomic_data(item: Any, index: int) -> AtomicData:
    """The ``AtomicData`` in a dataset item (``data`` or ``(data, metadata)``)."""
    if isinstance(item, tuple) and item and isinstance(item[0], AtomicData):
        item = item[0]
    if not isinstance(item, AtomicData):
        raise InvalidDataError(
            f"dataset item {index} is a {type(item).__name__}; a dataset must return AtomicData "
            "(or an (AtomicData, metadata) pair) from __getitem__"
        )
    return item


def all_metadata(dataset: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(num_atoms, num_edges)`` arrays for every structure of ``dataset``."""
    bulk = getattr(dataset, "get_all_metadata", None)
    if bulk is not None:
        atoms, edges = bulk()
        return np.asarray(atoms, dtype=np.int64), np.asarray(edges, dtype=np.int64)
    if not hasattr(dataset, "get_metadata"):
        raise InvalidDataError(
            f"{type(dataset).__name__} has no get_metadata(i); a dataset for SizeAwareSampler must "
            "return (num_atoms, num_edges) for each structure without loading it"
        )
    n = len(dataset)
    atoms = np.empty(n, dtype=np.int64)
    edges = np.empty(n, dtype=np.int64)
    for i in range(n):
        meta = dataset.get_metadata(i)
        atoms[i], edges[i] = int(meta[0]), int(meta[1])
    return atoms, edges


def all_system_ids(dataset: Any) -> np.ndarray | None:
    """The ``system_id`` each structure of ``dataset`` will have (its own, else its index), when
    the dataset can tell without loading structures (``get_all_system_ids()``); else None."""
    bulk = getattr(dataset, "get_all_system_ids", None)
    if bulk is None:
        return None
    ids = bulk()
    return None if ids is None else np.asarray(ids, dtype=np.int64).reshape(-1)


def harmonise_structures(structures: Sequence[AtomicData]) -> list[AtomicData]:
    """``structures`` made to batch together as :func:`harmonise` makes those of
    ``Batch.from_atoms``: the same objects when they already do (the same fields, each ``info``
    field of one kind and shape), else copies in which atom arrays and ``frozen`` that only some
    have get ASE's defaults and ``info`` keys that differ are kept as JSON, per structure.

    Example:
        >>> from ase.build import bulk
        >>> from alchemi_core.data import AtomicData, Batch
        >>> a, b = bulk("Fe"), bulk("Cu")  # Fe has initial_magmoms, Cu none
        >>> a.info["note"] = "magnetic"
        >>> from alchemi_core.data.datapipes import harmonise_structures
        >>> both = harmonise_structures([AtomicData.from_atoms(a), AtomicData.from_atoms(b)])
        >>> Batch.from_data_list(both).to_atoms()[1].info.get("note"), both[1].initial_magmoms.tolist()
        (None, [0.0])
    """
    items = list(structures)
    if len(items) < 2 or _alike(items):
        return items
    converted = [(dict(iter(d)), d.levels) for d in items]
    harmonise([f for f, _ in converted])
    out = []
    for fields, levels in converted:
        # Fields harmonise added: JSON info, charge, spin, ``symprec`` and ``fix_com`` (one row per
        # structure) or atom arrays.
        lv = {k: levels.get(k, "system" if k.startswith(INFO_PREFIXES) or k in SYSTEM_INFO
                            else KNOWN_LEVELS.get(k, "node")) for k in fields}
        out.append(AtomicData(levels=lv, **fields))
    return out


def _alike(items: list[AtomicData]) -> bool:
    """Whether the structures have the same fields and each info field the same kind and shape."""
    first = items[0]
    names = set(first.keys())
    forms = {k: (v.dtype, tuple(v.shape[1:])) for k, v in first if k.startswith(INFO_PREFIXES)}
    for d in items[1:]:
        if set(d.keys()) != names:
            return False
        for k, form in forms.items():
            v = d.get(k)
            if (v.dtype, tuple(v.shape[1:])) != form:
                return False
    return True


class ReaderDataset:
    """A dataset over ``self.reader`` whose sizes and ids are the reader's (subclasses give
    ``__getitem__``)."""

    reader: Any

    def __len__(self) -> int:
        return len(self.reader)

    def get_metadata(self, index: int) -> tuple[int, int]:
        meta = self.reader.get_metadata(index)
        return int(meta[0]), int(meta[1])

    def get_all_metadata(self) -> tuple[np.ndarray, np.ndarray]:
        return all_metadata(self.reader)

    def get_all_system_ids(self) -> np.ndarray | None:
        return all_system_ids(self.reader)


class ListDataset:
    """Structures held in memory; those whose fields differ as ``Batch.from_atoms`` accepts are
    kept as copies that batch together (:func:`harmonise_structures`).

    Args:
        structures: ``AtomicData`` objects.
        device: Where ``__getitem__`` puts them (default: where they are).
    """

    def __init__(self, structures: Sequence[AtomicData], device: torch.device | str | None = None) -> None:
        items = list(structures)
        for i, s in enumerate(items):
            as_atomic_data(s, i)
        self._items = harmonise_structures(items)
        self.device = device

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index: int) -> AtomicData:
        item = self.get_stored(index)
        return item.to(self.device) if self.device is not None else item

    def get_stored(self, index: int) -> AtomicData:
        """Structure ``index`` where it is held, not moved to ``device``: a sampler that builds a
        batch of many moves them together, one copy per field instead of one per structure."""
        return self._items[index]

    def get_metadata(self, index: int) -> tuple[int, int]:
        item = self._items[index]
        return item.num_nodes, item.num_edges

    def get_all_metadata(self) -> tuple[np.ndarray, np.ndarray]:
        return (
            np.fromiter((s.num_nodes for s in self._items), dtype=np.int64, count=len(self._items)),
            np.fromiter((s.num_edges for s in self._items), dtype=np.int64, count=len(self._items)),
        )

    def get_all_system_ids(self) -> np.ndarray:
        """Each structure's ``system_id``, or its index where it has none."""
        return np.fromiter(
            (int(s.system_id.reshape(-1)[0]) if "system_id" in s else i for i, s in enumerate(self._items)),
            dtype=np.int64, count=len(self._items),
        )


class Dataset(ReaderDataset):
    """A dataset over any reader (``len``, ``reader[i]`` and ``reader.get_metadata(i)``), or a
    plain list of ``AtomicData`` (harmonised as :class:`ListDataset` does), putting structures on
    ``device``.

    Args:
        reader: E.g. ``AtomicDataZarrReader("structures.zarr")``.
        device: Target device of the returned structures.

    Example:
        >>> from alchemi_core.data.datapipes import Dataset, ListDataset
        >>> ds = Dataset(ListDataset([]), device="cpu")
        >>> len(ds)
        0
        >>> import torch
        >>> from alchemi_core.data import AtomicData
        >>> Dataset([AtomicData(atomic_numbers=[1, 1], positions=torch.zeros(2, 3))]).get_all_metadata()
        (array([2]), array([0]))
    """

    def __init__(self, reader: Any, device: torch.device | str | None = None) -> None:
        for attr in ("__len__", "__getitem__"):
            if not hasattr(reader, attr):
                raise InvalidDataError(f"Dataset reader {type(reader).__name__} lacks {attr}")
        if isinstance(reader, (list, tuple)) and all(isinstance(d, AtomicData) for d in reader):
            reader = harmonise_structures(reader)  # as ListDataset does
        self.reader = reader
        self.device = device

    def __getitem__(self, index: int) -> AtomicData:
        data = self.get_stored(index)
        return data.to(self.device) if self.device is not None else data

    def get_stored(self, index: int) -> AtomicData:
        """Structure ``index`` as the reader gives it, not moved to ``device``."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for a dataset of {len(self)} structures")
        return as_atomic_data(self.reader[index], index)

    def get_metadata(self, index: int) -> tuple[int, int]:
        meta = getattr(self.reader, "get_metadata", None)
        if meta is not None:
            out = meta(index)
            return int(out[0]), int(out[1])
        data = as_atomic_data(self.reader[index], index)
        return data.num_nodes, data.num_edges

    def get_all_metadata(self) -> tuple[np.ndarray, np.ndarray]:
        if hasattr(self.reader, "get_metadata") or hasattr(self.reader, "get_all_metadata"):
            return all_metadata(self.reader)
        # A plain sequence (a list of AtomicData): each structure's sizes, one at a time.
        n = len(self)
        atoms, edges = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        for i in range(n):
            atoms[i], edges[i] = self.get_metadata(i)
        return atoms, edges


def __getattr__(name: str) -> Any:
    from alchemi_core.registry import resolve_export

    return resolve_export(__name__, name)
