"""``AtomicDataZarrWriter``: write structures (``AtomicData`` lists or batches) to an alchemi store,
e.g. a dataset for ``AtomicDataZarrReader`` and ``SizeAwareSampler``.

Structures are written in blocks of ``block_size``, each committed whole; an existing store is
continued. The store is the same as ``ZarrData``'s.

Example:
    >>> from alchemi_core.testing import random_structures
    >>> from alchemi_zarr import AtomicDataZarrWriter
    >>> writer = AtomicDataZarrWriter("memory://writer-doc")
    >>> writer.write(random_structures([4, 2]))
    2
    >>> writer.write(random_structures([3])[0]), len(writer)
    (1, 3)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from alchemi_core.data import AtomicData, Batch
from alchemi_core.errors import InvalidDataError
from alchemi_zarr.records import HostRecords, snapshot
from alchemi_zarr.storage import AtomicStore


class AtomicDataZarrWriter:
    """Appends structures to an alchemi Zarr store.

    Args:
        store: A local path, an fsspec URL, a dict or a zarr store; created when missing.
        units: Units of custom fields, recorded in the store.
        block_size: Structures per committed block when writing a list.
        storage_options: fsspec options for URLs.
    """

    def __init__(
        self,
        store: Any,
        units: Mapping[str, str] | None = None,
        block_size: int = 4096,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if int(block_size) < 1:
            raise InvalidDataError(f"block_size must be >= 1, got {block_size}")
        self.store = AtomicStore(store, read_only=False, storage_options=storage_options)
        self.units = dict(units or {})
        self.block_size = int(block_size)

    def write(self, data: AtomicData | Sequence[AtomicData] | Batch) -> int:
        """Append one structure, a list of them, or every system of a batch.

        Returns:
            The number of structures written.

        Raises:
            InvalidDataError: Not structures, or fields that differ from the store's records.
        """
        if isinstance(data, Batch):
            self._append(data)
            return data.num_graphs
        items = [data] if isinstance(data, AtomicData) else list(data)
        for i, item in enumerate(items):
            if not isinstance(item, AtomicData):
                raise InvalidDataError(
                    f"AtomicDataZarrWriter.write: item {i} is a {type(item).__name__}; pass AtomicData, "
                    "a list of them, or a Batch"
                )
        for lo in range(0, len(items), self.block_size):
            self._append(Batch.from_data_list(items[lo : lo + self.block_size]))
        return len(items)

    def _append(self, batch: Batch) -> None:
        if batch.num_graphs:
            self.store.append(HostRecords.from_snapshot(snapshot(batch, copy=False), self.units))

    def __len__(self) -> int:
        return self.store.num_systems

    def close(self) -> None:
        """Nothing to release: every ``write`` is committed before it returns."""

    def __enter__(self) -> AtomicDataZarrWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AtomicDataZarrWriter({self.store.where!r}, {len(self)} structures)"
