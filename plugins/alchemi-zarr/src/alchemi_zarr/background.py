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

import atexit
import queue
import sys
import threading
import weakref
from collections.abc import Callable, Mapping

from alchemi_core.errors import AlchemiError

from alchemi_zarr.records import HostRecords, Snapshot
from alchemi_zarr.storage import AtomicStore


def _at_exit(fn: Callable[[], object]) -> None:
    register = getattr(threading, "_register_atexit", None)  # CPython >= 3.9
    try:
        register(fn) if register is not None else atexit.register(fn)
    except RuntimeError:  # already shutting down: nothing can be scheduled any more
        pass


class BackgroundWriteError(AlchemiError, RuntimeError):
    """An asynchronous write failed; the message names the systems that were not stored."""


class BackgroundWriter:
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
        self.store = store
        self.max_merge = max(1, int(max_merge))
        self.units = dict(units or {})
        self._queue: queue.Queue[tuple[Snapshot, int] | None] = queue.Queue(maxsize=max(1, int(max_pending)))
        self._lock = threading.Lock()
        self._pending = 0
        self._errors: list[tuple[BaseException, Snapshot, int]] = []
        self._thread = threading.Thread(target=self._run, name=f"alchemi-zarr-writer {store.where}", daemon=True)
        self._thread.start()
        self._closed = False
        # Drain at interpreter exit, so a script that forgets close() keeps its data. This has to
        # run before concurrent.futures shuts its thread pools down (zarr writes through them),
        # which threading's exit callbacks do and plain atexit handlers would be too late for.
        # The weak reference lets an unused writer be collected.
        ref = weakref.ref(self)
        _at_exit(lambda: (w := ref()) is not None and w.close_quietly())

    @property
    def pending(self) -> int:
        """Systems submitted but not yet committed."""
        with self._lock:
            return self._pending

    def submit(self, snap: Snapshot, count: int) -> None:
        """Queue ``count`` systems for writing (blocks while ``max_pending`` are queued).

        Raises:
            BackgroundWriteError: An earlier write failed (this one is not queued).
        """
        if self._closed:
            raise BackgroundWriteError(f"the background writer of {self.store.where} is closed")
        self.raise_errors()
        with self._lock:
            self._pending += count
        self._queue.put((snap, count))

    def _run(self) -> None:
        while True:
            jobs = [self._queue.get()]
            # Coalesce whatever else is already queued: one commit for many small writes costs
            # one zarr round per field instead of one per write.
            while jobs[-1] is not None and len(jobs) < self.max_merge:
                try:
                    jobs.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            work = [j for j in jobs if j is not None]
            try:
                for group in self._same_fields(work):
                    self._write(group)
            finally:
                for _ in jobs:
                    self._queue.task_done()
            if jobs[-1] is None:
                return

    def _same_fields(self, jobs: list[tuple[Snapshot, int]]) -> list[list[tuple[HostRecords | None, Snapshot, int]]]:
        """Consecutive jobs with identical fields, converted to records, grouped for one append."""
        groups: list[list[tuple[HostRecords | None, Snapshot, int]]] = []
        for snap, count in jobs:
            try:
                records: HostRecords | None = HostRecords.from_snapshot(snap, self.units)
            except BaseException as exc:  # noqa: BLE001 - kept and raised in the caller's thread
                self._fail([(None, snap, count)], exc)
                continue
            if groups and groups[-1][0][0] is not None and groups[-1][0][0].specs == records.specs:
                groups[-1].append((records, snap, count))
            else:
                groups.append([(records, snap, count)])
        return groups

    def _write(self, group: list[tuple[HostRecords | None, Snapshot, int]]) -> None:
        try:
            self.store.append(HostRecords.concat([r for r, _, _ in group if r is not None]))
        except BaseException as exc:  # noqa: BLE001 - kept and raised in the caller's thread
            self._fail(group, exc)
            return
        with self._lock:
            self._pending -= sum(count for _, _, count in group)

    def _fail(self, group: list[tuple[HostRecords | None, Snapshot, int]], exc: BaseException) -> None:
        with self._lock:
            for _, snap, count in group:
                self._errors.append((exc, snap, count))
                self._pending -= count

    def raise_errors(self) -> None:
        """Raise the failures so far (once), naming every system that was not stored."""
        with self._lock:
            errors, self._errors = self._errors, []
        if not errors:
            return
        lost = sum(count for _, _, count in errors)
        ids: list[int] = []
        for _, snap, _ in errors:
            if snap.system_ids is not None:
                ids.extend(snap.system_ids.reshape(-1).tolist())
        first = errors[0][0]
        raise BackgroundWriteError(
            f"{len(errors)} background write(s) to {self.store.where} failed; {lost} systems were not "
            f"stored (system_id {ids[:20]}{'...' if len(ids) > 20 else ''}). First error: {first!r}"
        ) from first

    def flush(self) -> None:
        """Wait until everything submitted is written, then raise any failure."""
        if not self._closed:
            self._queue.join()
        self.raise_errors()

    def close(self) -> None:
        """Write what is pending, stop the thread, and raise any failure."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join()
        self.raise_errors()

    def close_quietly(self) -> None:
        """``close()`` where no caller is left to raise to (exit, garbage collection): failures
        go to stderr."""
        try:
            self.close()
        except BackgroundWriteError as exc:
            print(f"alchemi-zarr: {exc}", file=sys.stderr)
