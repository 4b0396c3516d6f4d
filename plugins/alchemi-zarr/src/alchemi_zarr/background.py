"""A background thread that appends snapshots to a store while the caller goes on stepping.

Jobs are written in the order they were submitted; jobs already waiting when the thread takes
the next one are merged into one append (one commit). A further ``submit`` blocks while
``max_pending`` wait, which bounds host memory. A failed job is raised, naming its systems, by
the next ``submit``, ``flush`` or ``close``; at interpreter exit, pending jobs are written.

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

from alchemi_zarr.pending import MAX_MERGE, AsyncWriter, BackgroundWriteError
from alchemi_zarr.records import HostRecords, Snapshot, same_field_runs
from alchemi_zarr.storage import AtomicStore

__all__ = ["BackgroundWriteError", "BackgroundWriter"]


class BackgroundWriter(AsyncWriter):
    """Appends submitted snapshots to ``store`` on a daemon thread, in order.

    Args:
        store: The store, opened for appending.
        units: Units of custom fields, recorded in the header.
        max_pending: Most snapshots waiting to be written before ``submit`` blocks.
    """

    def __init__(self, store: AtomicStore, units: Mapping[str, str] | None = None, max_pending: int = 8) -> None:
        super().__init__(store.where, max_pending, stored=store.num_systems)
        self.store = store
        self.units = dict(units or {})
        self._thread = threading.Thread(target=self._run, name=f"alchemi-zarr-writer {store.where}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            jobs = [self.queue.get()]
            while jobs[-1] is not None and len(jobs) < MAX_MERGE:
                try:
                    jobs.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            work = [j for j in jobs if j is not None]
            try:
                self._write(work)
            finally:
                for snap, _ in work:
                    snap.release()  # written or failed: the host buffers take the next copies
                for _ in jobs:
                    self.queue.task_done()
            if jobs[-1] is None:
                return

    def _write(self, jobs: list[tuple[Snapshot, int]]) -> None:
        """Append ``jobs``, each run of identical fields in one commit; a failure fails its jobs."""
        converted: list[tuple[HostRecords, tuple[Snapshot, int]]] = []
        for snap, count in jobs:
            try:
                converted.append((HostRecords.from_snapshot(snap, self.units), (snap, count)))
            except BaseException as exc:  # noqa: BLE001 - kept and raised in the caller's thread
                self.ledger.failed(exc, snap.id_list(), count)
        for run in same_field_runs(converted):
            try:
                self.store.append(HostRecords.concat([r for r, _ in run]))
            except BaseException as exc:  # noqa: BLE001 - kept and raised in the caller's thread
                for _, (snap, count) in run:
                    self.ledger.failed(exc, snap.id_list(), count)
            else:
                self.ledger.committed(sum(count for _, (_, count) in run), stored=self.store.num_systems)

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
