"""``ShardedZarrStore``: the results store of a data-parallel run, written by every rank at once,
each rank appending to its own part (the layout is :mod:`alchemi_zarr.sharded`'s).

Example:
    >>> from alchemi_core.testing import make_batch
    >>> root = ShardedZarrStore("memory://sharded-store-doc")
    >>> root.sink(0).write(make_batch([3, 2]))
    >>> root.sink(1).write(make_batch([4]))
    >>> sorted(root.committed_ids().tolist()), len(root.reader())
    ([0, 0, 1], 3)
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from alchemi_zarr.sharded import ShardedZarrReader, column_of, join_part, open_root, part_name, part_names, root_text
from alchemi_zarr.sink import ZarrData
from alchemi_zarr.storage import AtomicStore


class ShardedZarrStore:
    """The results store of a data-parallel run (an ``alchemi_core.parallel.ResultsStore``).

    Args:
        root: A local path or an fsspec URL; created when absent, continued when present.
        asynchronous: Passed to each part's ``ZarrData`` (write in the background).
        frame_statuses: Statuses of records that are trajectory frames, not results (e.g. the
            stage codes ``range(n_stages)`` when a run also snapshots into the store):
            ``committed_ids`` leaves them out, so a structure with frames but no result is not
            taken as done.
        storage_options: fsspec options for URLs.
        **sink_options: Other ``ZarrData`` options of the parts (``units``, ``max_pending``).

    Raises:
        InvalidDataError: ``root`` holds something other than a sharded store.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        asynchronous: bool | str = False,
        frame_statuses: Iterable[int] = (),
        storage_options: dict[str, Any] | None = None,
        **sink_options: Any,
    ) -> None:
        self.root = root_text(root)
        self.asynchronous = asynchronous
        self.frame_statuses = np.asarray(sorted(int(s) for s in frame_statuses), dtype=np.int64)
        self.storage_options = storage_options
        self.sink_options = sink_options
        self._group = open_root(self.root, True, storage_options)

    def part(self, rank: int) -> str:
        """Where rank ``rank``'s part lives."""
        return join_part(self.root, part_name(rank))

    def sink(self, rank: int) -> ZarrData:
        """Rank ``rank``'s part, as a sink (only that rank may write it)."""
        return ZarrData(self.part(rank), asynchronous=self.asynchronous,  # type: ignore[arg-type]
                        storage_options=self.storage_options, **self.sink_options)

    def _parts(self) -> list[AtomicStore]:
        group = open_root(self.root, True, self.storage_options)
        return [AtomicStore(join_part(self.root, name), read_only=True, storage_options=self.storage_options)
                for name in part_names(group)]

    def committed_ids(self) -> np.ndarray:
        """The ``system_id`` of every committed result (frames left out), over all parts (one
        column read per part, two with ``frame_statuses``).

        Raises:
            InvalidDataError: A part's records carry no ``system_id`` (or no ``status``).
        """
        ids = [self._results(part) for part in self._parts()]
        return np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)

    def _results(self, part: AtomicStore) -> np.ndarray:
        ids = column_of(part, "system_id")
        if not len(self.frame_statuses) or not len(ids):
            return ids
        status = column_of(part, "status")
        return ids[~np.isin(status, self.frame_statuses)]

    def committed_count(self) -> int:
        """Results committed over all parts (one small read per part without ``frame_statuses``)."""
        if len(self.frame_statuses):
            return len(self.committed_ids())
        return sum(part.num_systems for part in self._parts())

    def reader(self) -> ShardedZarrReader:
        """The union of the parts, as one dataset."""
        return ShardedZarrReader(self.root, storage_options=self.storage_options)

    def __repr__(self) -> str:
        return f"ShardedZarrStore({self.root!r})"
