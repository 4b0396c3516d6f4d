"""``ZarrData``: a data sink that stores systems in an alchemi Zarr store, on disk or any fsspec URL.

Each ``write`` stores the selected systems as whole records: a crash leaves every record either
fully readable or absent, and reopening the store continues after the last committed record.
With ``asynchronous=True`` the zarr part happens in the background while the dynamics loop goes
on: by a child process for a store another process can open (``"process"``), else by a thread
(``"thread"``). ``flush()`` waits for pending writes, ``close()`` also stops the writer; both
raise a failed write's error. ``len()`` and the capacity count pending systems.

Example:
    >>> from alchemi_core.testing import make_batch
    >>> from alchemi_zarr import ZarrData
    >>> sink = ZarrData("memory://sink-doc", capacity=100)
    >>> sink.write(make_batch([3, 2, 4]))
    >>> len(sink), sink.read().system_id.tolist()
    (3, [0, 1, 2])
    >>> ZarrData("memory://sink-doc", capacity=100).read().num_graphs   # reopening continues it
    3
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from alchemi_core.data import Batch
from alchemi_core.data.staging import HostStaging
from alchemi_core.dynamics.sinks import DataSink, capacity_error, selected_count
from alchemi_core.errors import CapacityError, ConfigurationError, InvalidDataError
from alchemi_core.tuning import check_tuning
from alchemi_zarr.records import HostRecords, snapshot
from alchemi_zarr.storage import AtomicStore
from alchemi_zarr.tuning import ZarrTuning
from alchemi_zarr.validity import IDENTITY, check_unique

if TYPE_CHECKING:
    from alchemi_zarr.background import BackgroundWriter
    from alchemi_zarr.process_writer import ProcessWriter

#: The capacity of a sink made without one.
UNLIMITED = 2**62


class ZarrData(DataSink):
    """Systems stored in an alchemi Zarr store (see the module docstring).

    Args:
        store: A local path, an fsspec URL (``memory://``, ``file://``, ``s3://`` with
            ``alchemi-zarr[s3]``), a dict, or a zarr store object; an existing one is continued.
        capacity: Most systems the store may hold, those already in it included (None: no limit).
        asynchronous: Write in the background (call ``flush()``/``close()`` to wait): True picks
            a child process for stores another process can open and a thread otherwise;
            ``"process"`` or ``"thread"`` choose.
        max_pending: In asynchronous mode, most writes queued before ``write`` blocks.
        units: Units of custom fields, recorded in the store, e.g. ``{"dipole": "e*Å"}``.
        storage_options: fsspec options for URLs (credentials, endpoints).
        tuning: How writes copy a batch off its device (default: ``ZarrTuning.for_device``).

    Raises:
        InvalidDataError: ``store`` holds something other than an alchemi store.
    """

    def __init__(
        self,
        store: Any,
        capacity: int | None = None,
        *,
        asynchronous: bool | Literal["process", "thread"] = False,
        max_pending: int = 8,
        units: Mapping[str, str] | None = None,
        storage_options: dict[str, Any] | None = None,
        tuning: ZarrTuning | None = None,
    ) -> None:
        check_tuning("ZarrData", tuning, ZarrTuning)
        self.tuning = tuning
        if capacity is not None and int(capacity) < 0:
            raise ConfigurationError(f"ZarrData capacity must be >= 0 (or None for no limit), got {capacity}")
        self._capacity = UNLIMITED if capacity is None else int(capacity)
        self.units = dict(units or {})
        self._background: BackgroundWriter | ProcessWriter | None = None
        self._mode: str | None = None
        from alchemi_zarr.sharded import ShardedZarrReader, is_sharded

        #: The root of a sharded store (a data-parallel run's) reads as one set; it takes no writes.
        self._sharded = ShardedZarrReader(store, storage_options) if is_sharded(store, storage_options) else None
        if self._sharded is not None:
            return
        self._store = AtomicStore(store, read_only=False, storage_options=storage_options)
        self._staging = HostStaging(1)  # host buffers of synchronous writes from a GPU
        mode = self._mode = _writer_mode(asynchronous, store)
        if mode == "thread":
            from alchemi_zarr.background import BackgroundWriter

            self._background = BackgroundWriter(self.store, self.units, max_pending)
        elif mode == "process":
            from alchemi_zarr.process_writer import ProcessWriter

            self._background = ProcessWriter(
                os.fspath(store), self.store.where, storage_options, self.units, max_pending,
                stored=self.store.num_systems,
            )
        if self._background is not None:
            weakref.finalize(self, self._background.close_dropped)

    @property
    def store(self) -> AtomicStore:
        """The store written to.

        Raises:
            InvalidDataError: This sink reads the root of a sharded store, which has one store per
                writing rank (``ShardedZarrStore(root).sink(rank)`` writes one).
        """
        if self._sharded is not None:
            raise InvalidDataError(
                f"ZarrData({self._sharded.root}) is the root of a sharded results store (a data-parallel run's): "
                "it reads as one set (read(), reader(), len()), but each rank writes its own part. Write through "
                "alchemi_zarr.ShardedZarrStore(root).sink(rank), or give ZarrData a new path"
            )
        return self._store

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def asynchronous(self) -> bool:
        return self._background is not None

    @property
    def writer(self) -> str | None:
        """Who writes in the background: ``"process"``, ``"thread"`` or None (synchronous)."""
        return self._mode

    def __len__(self) -> int:
        if self._background is not None:
            return self._background.ledger.held()
        if self._sharded is not None:
            return self._sharded.refresh()
        return self.store.num_systems

    def write(self, batch: Batch, mask: torch.Tensor | None = None) -> None:
        """Store the systems of ``batch`` where ``mask`` is True (all when None), as whole records.

        Raises:
            RuntimeError: They would exceed the capacity (nothing is written), or an earlier
                asynchronous write failed.
            ValueError: A mask of the wrong shape or dtype, or fields that differ from the
                records already in the store.
        """
        n, m = selected_count(batch, mask, "ZarrData")
        if self._background is not None:
            self._background.raise_errors()
        held = len(self)
        if held + n > self._capacity:
            raise capacity_error(f"ZarrData({self.store.where})", n, held, self._capacity)
        if n == 0:
            return
        selected = batch.index_select(m) if m is not None else batch
        if self._background is None:
            # From a GPU through one reused pinned buffer set.
            slot = self._staging.acquire() if selected.device.type == "cuda" else None
            try:
                self.store.append(HostRecords.from_snapshot(snapshot(selected, copy=False, slot=slot), self.units))
            finally:
                if slot is not None:
                    self._staging.release(slot)
        else:
            self._background.submit_batch(selected, n, self.tuning)

    def read(self) -> Batch:
        """Every stored system as one batch on the CPU (after pending writes); for the root of a
        sharded store, the records of every part.

        Raises:
            RuntimeError: The store holds no systems.
            InvalidDataError: A record is not a valid structure, a chunk is damaged, or (in a
                run's records, which have ``status``) a structure's last record is stored twice.
        """
        if self._sharded is not None:
            if self._sharded.refresh() == 0:
                raise CapacityError(f"ZarrData({self._sharded.root}) is empty: nothing to read")
            batch, where = self._sharded.read_batch(), self._sharded.root
        else:
            if self._committed() == 0:
                raise CapacityError(f"ZarrData({self.store.where}) is empty: nothing to read")
            batch, where = self.store.read_batch(0, self.store.num_systems), self.store.where
        if "status" in batch:  # a run's records: each structure's result is stored once
            check_unique({k: getattr(batch, k) for k in IDENTITY if k in batch}, 0, where)
        return batch

    def zero(self) -> None:
        """Forget every record (the store becomes empty; its space is freed)."""
        self.flush()
        self.store.clear()
        if self._background is not None:
            self._background.ledger.cleared()

    def state_dict(self) -> dict[str, Any]:
        """Where the store is, how many records it committed (after pending writes), and the
        ``system_id`` of the last one."""
        n = self._committed()
        return {"where": self.store.where, "committed": n, "last_system_id": self._system_id_of(n - 1)}

    def _committed(self) -> int:
        """Records committed, after pending writes."""
        self.flush()
        self.store.refresh()
        return self.store.num_systems

    def _system_id_of(self, record: int) -> int | None:
        """The ``system_id`` of committed record ``record`` (None without one, or for record -1)."""
        if record < 0 or self.store.header is None or "system_id" not in self.store.header.fields:
            return None
        return int(self.store.read_rows("system_id", record, record + 1).reshape(-1)[0])

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Return the store to the checkpoint: records committed after it are cut off (the resumed
        run writes them again).

        Raises:
            InvalidDataError: The store holds fewer records than the checkpoint counted, or a
                different record where the checkpoint's last one was (it was replaced or changed).
        """
        keep, held = int(state["committed"]), self._committed()
        where = self.store.where
        if held < keep:
            raise InvalidDataError(
                f"ZarrData({where}) holds {held} records but the checkpoint counted {keep}: the store was "
                "replaced or cut since the checkpoint; resume with the store the checkpointed run wrote"
            )
        last, found = state.get("last_system_id"), self._system_id_of(keep - 1)
        if last is not None and found is not None and found != int(last):
            raise InvalidDataError(
                f"ZarrData({where}): record {keep - 1} has system_id {found} but the checkpoint's has "
                f"{last}: this is not the store the checkpointed run wrote"
            )
        self.store.truncate(keep)
        if self._background is not None:
            self._background.ledger.cleared(stored=keep)

    def flush(self) -> None:
        """Wait until every write so far is committed.

        Raises:
            BackgroundWriteError: A background write failed (its systems are named).
        """
        if self._background is not None:
            self._background.flush()

    def close(self) -> None:
        """Flush and stop the background writer (a no-op for a synchronous sink)."""
        if self._background is not None:
            self._background.close()

    def __enter__(self) -> ZarrData:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def reader(self) -> Any:
        """A reader of every record (after flushing): an ``AtomicDataZarrReader``, or for the root
        of a sharded store a ``ShardedZarrReader`` (the same interface, over all its parts)."""
        from alchemi_zarr.reader import AtomicDataZarrReader

        if self._sharded is not None:
            self._sharded.refresh()
            return self._sharded
        self.flush()
        return AtomicDataZarrReader(self.store.zarr_store)

    def to_extxyz(self, path: str | Path) -> int:
        """Write every stored system to an extended XYZ file (see ``alchemi_zarr.extxyz.write_extxyz``)."""
        from alchemi_zarr.extxyz import write_extxyz

        return write_extxyz(self.reader(), path)

    def __repr__(self) -> str:
        mode = f", asynchronous={self.writer!r}" if self.asynchronous else ""
        cap = "unlimited" if self._capacity == UNLIMITED else self._capacity
        where = self._sharded.root if self._sharded is not None else self.store.where
        return f"ZarrData({where!r}, {len(self)}/{cap}{mode})"


def _writer_mode(asynchronous: Any, store: Any) -> str | None:
    """"process", "thread" or None for the ``asynchronous`` argument and the ``store`` given."""
    if asynchronous is False or asynchronous is None:
        return None
    reachable = isinstance(store, os.PathLike) or (isinstance(store, str) and not store.startswith("memory://"))
    if asynchronous is True:
        return "process" if reachable else "thread"
    if asynchronous == "thread":
        return "thread"
    if asynchronous == "process":
        if not reachable:
            raise ConfigurationError(
                f"ZarrData(asynchronous='process') needs a store another process can open (a local path "
                f"or a URL other than memory://), got {store!r}; use asynchronous='thread' for it"
            )
        return "process"
    raise ConfigurationError(f"ZarrData asynchronous must be True, False, 'process' or 'thread', got {asynchronous!r}")
