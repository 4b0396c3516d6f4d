"""A background thread that appends snapshots to a store while the caller goes on stepping.

Jobs are written in the order they were submitted; jobs already waiting when the thread takes
the next one are merged into one append (one commit), which makes many small writes cheap. At most ``max_pending`` wait in the queue; a
further ``submit`` blocks until one is written, which bounds host memory. A failed job is kept,
with the ``system_id`` of the systems it held, and raised by the next ``submit``, ``flush`` or
``close``: nothing is lost silently. At interpreter exit, pending jobs are written before the
process ends.

Example:
    >>> from alchemi_core.testing import make_batch
    >>> from alchemi_zarr.records import snapshot
    >>> from alchemi_zarr.storage import AtomicStore
    >>> writer = BackgroundWriter(AtomicStore("memory://background-doc", read_only=False))
    >>> writer.submit(snapshot(make_batch([2, 3]), copy=True), count=2)
    >>> writer.flush(); writer.store.num_systems
    2
    >>> writer.close()
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping

from alchemi_zarr.pending import AsyncWriter, BackgroundWriteError
from alchemi_zarr.records import HostRecords, Snapshot, same_field_runs
from alchemi_zarr.storage import AtomicStore

__all__ = ["BackgroundWriteError", "BackgroundWriter"]


class BackgroundWriter(AsyncWriter):
    """Appends submitted snapshots to ``store`` on a daemon thread, in order.

    Args:
        store: The store, opened for appending.
        units: Units of custom fields, recorded in the header.
        max_pending: Most snapshots waiting to be written before ``submit`` blocks.
        max_merge: Most queued snapshots committed together in one append.
    """

    def __init__(
        self, store: AtomicStore, units: Mapping[str, str] | None = None, max_pending: int = 8, max_merge: int = 64
    ) -> None:
        super().__init__(store.where, max_pending, stored=store.num_systems)
        self.store = store
        self.max_merge = max(1, int(max_merge))
        self.units = dict(units or {})
        self._thread = threading.Thread(target=self._run, name=f"alchemi-zarr-writer {store.where}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            jobs = [self.queue.get()]
            # Coalesce whatever else is already queued: one commit for many small writes costs
            # one zarr round per field instead of one per write.
            while jobs[-1] is not None and len(jobs) < self.max_merge:
                try:
                    jobs.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            work = [j for j in jobs if j is not None]
            try:
                for group in self._same_fields(work):
                    self._write(group)
            finally:
                for snap, _ in work:
                    snap.release()  # written or failed: the host buffers take the next copies
                for _ in jobs:
                    self.queue.task_done()
            if jobs[-1] is None:
                return

    def _same_fields(self, jobs: list[tuple[Snapshot, int]]) -> list[list[tuple[HostRecords, tuple[Snapshot, int]]]]:
        """Jobs converted to records (a failed conversion fails its job alone), grouped into runs
        with identical fields, each committed by one append."""
        converted: list[tuple[HostRecords, tuple[Snapshot, int]]] = []
        for snap, count in jobs:
            try:
                converted.append((HostRecords.from_snapshot(snap, self.units), (snap, count)))
            except BaseException as exc:  # noqa: BLE001 - kept and raised in the caller's thread
                self.ledger.failed(exc, snap.id_list(), count)
        return same_field_runs(converted)

    def _write(self, group: list[tuple[HostRecords, tuple[Snapshot, int]]]) -> None:
        try:
            self.store.append(HostRecords.concat([r for r, _ in group]))
        except BaseException as exc:  # noqa: BLE001 - kept and raised in the caller's thread
            for _, (snap, count) in group:
                self.ledger.failed(exc, snap.id_list(), count)
            return
        self.ledger.committed(sum(count for _, (_, count) in group), stored=self.store.num_systems)

    def flush(self) -> None:
        """Wait until everything submitted is written, then raise any failure."""
        if not self.closed:
            self.queue.join()
        self.raise_errors()

    def close(self) -> None:
        """Write what is pending, stop the thread, and raise any failure."""
        if not self.closed:
            self.closed = True
            self.queue.put(None)
            self._thread.join()
        self.raise_errors()
