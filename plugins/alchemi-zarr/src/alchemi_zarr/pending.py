"""Bookkeeping shared by the asynchronous writers: what is pending, what failed, exit draining.

A writer records each submitted write with :meth:`WriteLedger.submitted`, then either
:meth:`~WriteLedger.committed` or :meth:`~WriteLedger.failed` once the store has answered.
Failures are kept with the ``system_id`` of the systems they held and raised, once, by
:meth:`~WriteLedger.raise_errors`: nothing is lost silently.

Example:
    >>> ledger = WriteLedger("memory://doc")
    >>> ledger.submitted(3); ledger.held()
    3
    >>> ledger.failed(OSError("disk full"), [4, 5], 2); ledger.committed(1, stored=1)
    >>> ledger.held()
    1
    >>> try:
    ...     ledger.raise_errors()
    ... except BackgroundWriteError as exc:
    ...     print(str(exc).split(". First")[0])
    1 background write(s) to memory://doc failed; 2 systems were not stored (system_id [4, 5])
"""

from __future__ import annotations

import atexit
import queue
import sys
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from alchemi_core.data.staging import HostStaging, StagingSlot
from alchemi_core.errors import AlchemiError
from alchemi_zarr.records import Snapshot, snapshot
from alchemi_zarr.tuning import ZarrTuning

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: Most queued jobs a writer commits together in one append.
MAX_MERGE = 64


class BackgroundWriteError(AlchemiError, RuntimeError):
    """An asynchronous write failed; the message names the systems that were not stored."""


class WriteLedger:
    """Counts of pending systems and the failures of one asynchronous writer (thread-safe).

    Args:
        where: The store, as messages name it.
        stored: Systems already in the store.
    """

    def __init__(self, where: str, stored: int = 0) -> None:
        self.where = where
        self._changed = threading.Condition()
        self._pending = 0
        self._stored = int(stored)
        self._errors: list[tuple[BaseException, list[int], int]] = []

    def held(self) -> int:
        """Systems in the store plus those pending, read together (what capacity counts)."""
        with self._changed:
            return self._stored + self._pending

    def submitted(self, count: int) -> None:
        with self._changed:
            self._pending += count

    def committed(self, count: int, stored: int) -> None:
        """``count`` pending systems were committed; the store now holds ``stored``."""
        with self._changed:
            self._pending -= count
            self._stored = int(stored)
            self._changed.notify_all()

    def cleared(self, stored: int = 0) -> None:
        """The store was emptied, or cut back to ``stored`` records (nothing may be pending)."""
        with self._changed:
            self._stored = int(stored)

    def failed(self, exc: BaseException, system_ids: Sequence[int], count: int) -> None:
        with self._changed:
            self._errors.append((exc, list(system_ids), count))
            self._pending -= count
            self._changed.notify_all()

    def wait_until_idle(self, alive: Callable[[], bool], poll_s: float = 0.5) -> None:
        """Wait until nothing is pending, or until ``alive()`` says the writer is gone."""
        with self._changed:
            while self._pending > 0 and alive():
                self._changed.wait(poll_s)

    def raise_errors(self) -> None:
        """Raise the failures so far (once), naming every system that was not stored."""
        with self._changed:
            errors, self._errors = self._errors, []
        if not errors:
            return
        lost = sum(count for _, _, count in errors)
        ids = [i for _, system_ids, _ in errors for i in system_ids]
        first = errors[0][0]
        raise BackgroundWriteError(
            f"{len(errors)} background write(s) to {self.where} failed; {lost} systems were not "
            f"stored (system_id {ids[:20]}{'...' if len(ids) > 20 else ''}). First error: {first!r}"
        ) from first


class AsyncWriter(ABC):
    """What both asynchronous writers share: a bounded queue of ``(snapshot, count)`` jobs, the
    ledger, refusing work once closed, and draining at interpreter exit. Subclasses consume
    ``self.queue`` (``None`` means stop) and define ``flush()`` (wait until everything submitted
    is committed, then raise any failure) and ``close()`` (also stop the writer).

    Args:
        where: The store, as messages name it.
        max_pending: Most jobs waiting in the queue before ``submit`` blocks.
        stored: Systems already in the store.
        make_slot: Makes the staging slots (default: ``HostStaging``'s).
    """

    def __init__(
        self, where: str, max_pending: int, stored: int, make_slot: Callable[[int], StagingSlot] | None = None
    ) -> None:
        self.where = where
        self.ledger = WriteLedger(where, stored=stored)
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, int(max_pending)))
        # Host buffers for the queued jobs, the one being written and the one being copied.
        self.staging = HostStaging(self.queue.maxsize + 2, make_slot=make_slot)
        self.closed = False
        # Drained at interpreter exit, before concurrent.futures stops the thread pools zarr
        # writes through (a plain atexit handler would come too late). Weakly: an unused writer
        # can be collected.
        ref = weakref.ref(self)

        def drain() -> None:
            writer = ref()
            if writer is not None:
                writer.close_quietly()

        register = getattr(threading, "_register_atexit", atexit.register)
        try:
            register(drain)
        except RuntimeError:  # already shutting down: nothing can be scheduled any more
            pass

    @abstractmethod
    def flush(self) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    def submit(self, snap: Snapshot, count: int) -> None:
        """Queue a snapshot of ``count`` systems for writing (blocks while ``max_pending`` jobs
        wait); the writer calls ``snap.release()`` once it no longer needs the host data.

        Raises:
            BackgroundWriteError: An earlier write failed or the writer is closed (this one is
                not queued).
        """
        try:
            self._refuse_work_if_closed_or_failed()
        except BaseException:
            snap.release()
            raise
        self.ledger.submitted(count)
        self.queue.put((snap, count))

    def submit_batch(self, batch: Batch, count: int, tuning: ZarrTuning | None = None) -> None:
        """Copy ``batch`` (``count`` systems) into reused host buffers, as ``tuning`` says (default:
        the batch device's), and queue it (see :meth:`submit`); waits while every buffer is in use."""
        self._refuse_work_if_closed_or_failed()  # before waiting for a buffer
        slot = self.staging.acquire()
        self.submit(snapshot(batch, copy=True, slot=slot, release=partial(self.staging.release, slot), tuning=tuning),
                    count)

    def raise_errors(self) -> None:
        """Raise the failures so far (once), naming every system that was not stored."""
        self.ledger.raise_errors()

    def _refuse_work_if_closed_or_failed(self) -> None:
        if self.closed:
            raise BackgroundWriteError(f"the background writer of {self.where} is closed")
        self.raise_errors()

    def close_dropped(self) -> None:
        """:meth:`close_quietly` for a sink dropped without ``close()`` (its finalizer), on a
        thread of its own.

        A finalizer runs on whatever thread collects the sink, zarr's event-loop thread or one of
        the loop's executor threads among them; waiting there for the writer, whose writes wait
        on that loop, would never end. The thread is not a daemon: the interpreter waits for it
        at exit, while zarr's loop still runs.
        """
        threading.Thread(target=self.close_quietly, name="alchemi-zarr-close").start()

    def close_quietly(self) -> None:
        """``close()`` where no caller is left to raise to (exit, garbage collection): failures
        go to stderr."""
        try:
            self.close()
        except BackgroundWriteError as exc:
            print(f"alchemi-zarr: {exc}", file=sys.stderr)
