"""``ProcessWriter``: appends done by a child process, off the stepping interpreter.

A writer thread would share the stepping process's interpreter lock with zarr's per-chunk Python
work, delaying every step that wants it back. Here the stepping process only waits for each
snapshot's device-to-host copy (on a helper thread, lock released) and tells a child process
(``python -m alchemi_zarr.process_writer``) where it lies: on Linux in shared-memory staging
slots (:mod:`alchemi_zarr.shared_staging`), so only a header goes through the pipe; elsewhere,
and for fields the writer transforms, the arrays go through the pipe. The child appends them,
merging jobs that queue up, and answers in order. Nothing is lost silently:

- a failed append is raised, naming the systems, by the next ``submit``, ``flush`` or ``close``;
- if the child dies, every job it had not committed is reported the same way;
- if the parent dies, the child commits every job it received whole, then exits; a job cut off
  mid-transfer is never written, and the store's commit protocol keeps a crash of the child
  itself from tearing a record.

The store must be one another process can open: a local path or a URL other than ``memory://``.

Example:
    >>> import tempfile
    >>> from alchemi_core.testing import make_batch
    >>> from alchemi_zarr.records import snapshot
    >>> path = tempfile.mkdtemp() + "/doc.zarr"
    >>> writer = ProcessWriter(path, where=path)
    >>> writer.submit(snapshot(make_batch([2, 3]), copy=True), count=2)
    >>> writer.flush(); writer.ledger.held()
    2
    >>> writer.close()
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from alchemi_zarr.pending import MAX_MERGE, AsyncWriter, BackgroundWriteError
from alchemi_zarr.records import HostRecords, Snapshot, same_field_runs
from alchemi_zarr.shared_staging import SharedSlot, SlotMaps, shared_staging_available

#: Seconds ``close`` waits for the child to exit after its last job before killing it.
EXIT_WAIT_S = 60.0
_PIPE_BYTES = 1 << 20  # a wider pipe: fewer system calls per snapshot
_STOP = None


class ProcessWriter(AsyncWriter):
    """Appends submitted snapshots to a store from a child process, in order.

    Args:
        store: A local path or fsspec URL another process can open.
        where: The store, as messages name it.
        storage_options: fsspec options for URLs.
        units: Units of custom fields, recorded in the header.
        max_pending: Most snapshots waiting in this process before ``submit`` blocks.
        stored: Systems already in the store.
    """

    def __init__(
        self,
        store: str,
        where: str,
        storage_options: dict[str, Any] | None = None,
        units: Mapping[str, str] | None = None,
        max_pending: int = 8,
        stored: int = 0,
    ) -> None:
        shared = shared_staging_available()
        super().__init__(where, max_pending, stored, make_slot=SharedSlot if shared else None)
        self.units = dict(units or {})
        # (count, system ids, snapshot whose shared memory the child reads, or None) per job sent
        self._answers_due: deque[tuple[int, list[int], Snapshot | None]] = deque()
        self._gone: BaseException | None = None
        self._lock = threading.Lock()
        fds = [slot.fd for slot in self.staging.all if isinstance(slot, SharedSlot)]
        self._child, self._jobs, self._answers = _start_child(fds)
        self._jobs.send({"store": store, "storage_options": storage_options, "slot_fds": fds})
        self._feeder = threading.Thread(target=self._feed, name=f"alchemi-zarr-feeder {where}", daemon=True)
        self._reader = threading.Thread(target=self._read, name=f"alchemi-zarr-answers {where}", daemon=True)
        self._feeder.start()
        self._reader.start()

    def flush(self) -> None:
        """Wait until everything submitted is committed, then raise any failure."""
        self.queue.join()  # every job sent to the child (or failed before)
        self.ledger.wait_until_idle(alive=self._reader.is_alive)
        self.raise_errors()

    def close(self) -> None:
        """Commit what is pending, stop the child, and raise any failure."""
        if not self.closed:
            self.closed = True
            self.queue.put(_STOP)
            self._feeder.join()
            self._reader.join(timeout=EXIT_WAIT_S)
            try:
                self._child.wait(timeout=EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                self._child.kill()
                self._child.wait()
            self._answers.close()
            for slot in self.staging.all:
                if isinstance(slot, SharedSlot):
                    slot.close()
        self.raise_errors()

    def _feed(self) -> None:
        """Wait for each snapshot's copy, then stream it to the child (the lock is released while
        waiting and while the pipe takes the bytes)."""
        while True:
            item = self.queue.get()
            try:
                if item is _STOP:
                    self._send_stop()
                    return
                snap, count = item
                keep = False
                try:
                    records = HostRecords.from_snapshot(snap, self.units)
                except BaseException as exc:  # noqa: BLE001 - kept and raised in the caller's thread
                    self.ledger.failed(exc, snap.id_list(), count)
                else:
                    keep = self._send(records, count, snap)
                finally:
                    if not keep:  # sent through the pipe, or failed: the buffers take the next copy
                        snap.release()
            finally:
                self.queue.task_done()

    def _send(self, records: HostRecords, count: int, snap: Snapshot) -> bool:
        """Send one job; True when the child reads it from the snapshot's shared slot (which is
        then released when the child answers for it)."""
        ids = snap.id_list()
        slot = snap.slot if isinstance(snap.slot, SharedSlot) else None
        fields = []
        for name, a in records.fields.items():
            where = slot.layout_of(a) if slot is not None else None
            fields.append((name, a.dtype.str, a.shape, None if where is None else where[0]))
        shared = any(f[3] is not None for f in fields)
        with self._lock:
            gone = self._gone
            if gone is None:
                self._answers_due.append((count, ids, snap if shared else None))
        if gone is not None:
            self.ledger.failed(gone, ids, count)
            return False
        header = {
            "count": count,
            "specs": records.specs,
            "num_atoms": records.num_atoms,
            "num_edges": records.num_edges,
            "fields": fields,
            "slot": None if slot is None else (slot.index, slot.size),
        }
        try:
            self._jobs.send(header)
            for (_, _, _, offset), a in zip(fields, records.fields.values(), strict=True):
                if offset is None:
                    self._jobs.send_bytes(np.ascontiguousarray(a).reshape(-1).view(np.uint8))  # type: ignore[arg-type]
        except OSError as exc:  # the child is gone; the answer reader reports what it held
            self._child_gone(BackgroundWriteError(f"the writer process of {self.where} is gone ({exc!r})"))
        return shared

    def _send_stop(self) -> None:
        try:
            self._jobs.send(_STOP)
        except OSError:
            pass
        self._jobs.close()

    def _read(self) -> None:
        """Take the child's answers, in order, until it exits."""
        while True:
            try:
                answer = self._answers.recv()
            except (EOFError, OSError):
                code = self._child.wait()
                if self._answers_due:
                    self._child_gone(
                        BackgroundWriteError(f"the writer process of {self.where} ended (exit code {code}) "
                                             "before committing these systems")
                    )
                return
            kind = answer[0]
            if kind == "committed":
                _, jobs, stored = answer
                count = sum(self._take_due()[0] for _ in range(jobs))
                self.ledger.committed(count, stored=stored)
            elif kind == "failed":
                _, jobs, exc = answer
                for _ in range(jobs):
                    count, ids = self._take_due()
                    self.ledger.failed(exc, ids, count)
            elif kind == "fatal":  # the child could not open the store
                self._child_gone(answer[1])

    def _take_due(self) -> tuple[int, list[int]]:
        """The oldest job's count and ids; its shared slot, if any, is free again."""
        with self._lock:
            count, ids, snap = self._answers_due.popleft()
        if snap is not None:
            snap.release()
        return count, ids

    def _child_gone(self, exc: BaseException) -> None:
        """Fail every job the child has not answered, and every later one."""
        with self._lock:
            if self._gone is None:
                self._gone = exc
            due, self._answers_due = list(self._answers_due), deque()
        for count, ids, snap in due:
            self.ledger.failed(exc, ids, count)
            if snap is not None:
                snap.release()


def _start_child(slot_fds: list[int]) -> tuple[subprocess.Popen[bytes], Connection, Connection]:
    """Start ``python -m alchemi_zarr.process_writer`` with a job pipe and an answer pipe: a fresh
    interpreter on the parent's ``sys.path`` (no re-run ``__main__``, no inherited CUDA context)."""
    jobs_r, jobs_w = os.pipe()
    answers_r, answers_w = os.pipe()
    _widen(jobs_w)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "alchemi_zarr.process_writer", str(jobs_r), str(answers_w)],
            pass_fds=(jobs_r, answers_w, *slot_fds),
            stdin=subprocess.DEVNULL,
            env=env,
        )
    finally:
        os.close(jobs_r)
        os.close(answers_w)
    return child, Connection(jobs_w, readable=False), Connection(answers_r, writable=False)


def _widen(fd: int) -> None:
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_BYTES)
    except (ImportError, OSError):  # not Linux, or above the system's limit: the default works
        pass


def _receive(jobs: Connection, maps: SlotMaps) -> tuple[HostRecords, int] | None:
    """The next whole job, or None at the stop message or end of file (a cut-off job is dropped).
    Fields in a shared slot are read where they lie; the others come through the pipe."""
    try:
        header = jobs.recv()
        if header is _STOP:
            return None
        fields = {}
        for name, dtype, shape, offset in header["fields"]:
            if offset is None:
                fields[name] = np.frombuffer(jobs.recv_bytes(), dtype=np.dtype(dtype)).reshape(shape)
            else:
                slot, size = header["slot"]
                fields[name] = maps.array(slot, size, offset, dtype, shape)
    except EOFError:
        return None
    return HostRecords(fields, header["specs"], header["num_atoms"], header["num_edges"]), header["count"]


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError with its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any unpicklable exception
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _answer(answers: Connection, message: tuple[Any, ...]) -> None:
    """Send ``message`` to the parent; a parent that is gone no longer listens, but the jobs it
    sent are still committed."""
    try:
        answers.send(message)
    except OSError:
        pass


def serve(jobs: Connection, answers: Connection) -> int:
    """The child's loop: open the store, then append jobs in order and answer each group."""
    from alchemi_zarr.storage import AtomicStore

    init = jobs.recv()
    try:
        store = AtomicStore(init["store"], read_only=False, storage_options=init["storage_options"])
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        _answer(answers, ("fatal", _portable(exc)))
        return 1
    maps = SlotMaps(init["slot_fds"])
    stopping = False
    while not stopping:
        job = _receive(jobs, maps)
        if job is None:
            return 0
        received = [job]
        while len(received) < MAX_MERGE and jobs.poll():
            job = _receive(jobs, maps)
            if job is None:
                stopping = True
                break
            received.append(job)
        for run in same_field_runs(received):
            try:
                store.append(HostRecords.concat([records for records, _ in run]))
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                _answer(answers, ("failed", len(run), _portable(exc)))
            else:
                _answer(answers, ("committed", len(run), store.num_systems))
    return 0


def main(argv: list[str]) -> int:
    jobs = Connection(int(argv[0]), writable=False)
    answers = Connection(int(argv[1]), readable=False)
    try:
        return serve(jobs, answers)
    finally:
        answers.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
