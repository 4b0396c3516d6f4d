"""Move small tables from the device to a background consumer without stalling the step.

``HostTransfer.submit(table, meta)`` enqueues a non-blocking copy of ``table`` into a pinned host
buffer, records a CUDA event behind it and returns at once; a worker thread waits on that event
(the wait releases the GIL), then hands the host copy to ``consume(array, meta)``, in submission
order. On a CPU the copy is a plain one. A fixed ring of buffers is reused, so a run allocates
pinned memory only when a table outgrows its slot; when every slot is still waiting for the
consumer, ``submit`` waits for one (the consumer is then the bottleneck and the wait bounds
memory). An exception in ``consume`` is raised, as :class:`HookWorkerError`, by the next
``submit`` or by ``close``: nothing fails silently.

Example:
    >>> import torch
    >>> from alchemi_hooks.host_transfer import HostTransfer
    >>> seen = []
    >>> transfer = HostTransfer(lambda array, meta: seen.append((meta, float(array.sum()))), name="demo")
    >>> transfer.submit(torch.ones(3, 2, dtype=torch.float64), meta=7)
    >>> transfer.close()
    >>> seen
    [(7, 6.0)]
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from alchemi_hooks.errors import HookWorkerError

_STOP = object()


class _Slot:
    """One host buffer and the event that says when the copy into it has landed."""

    __slots__ = ("host", "event")

    def __init__(self) -> None:
        self.host: torch.Tensor | None = None
        self.event: Any = None

    def host_view(self, like: torch.Tensor) -> torch.Tensor:
        """Rows ``[:len(like)]`` of a host buffer shaped like ``like`` (grown when too small)."""
        n = like.shape[0]
        h = self.host
        if h is None or h.shape[0] < n or h.shape[1:] != like.shape[1:] or h.dtype != like.dtype:
            rows = max(n, 2 * h.shape[0] if h is not None else n, 1)
            self.host = h = torch.empty((rows, *like.shape[1:]), dtype=like.dtype, pin_memory=like.is_cuda)
        return h[:n]


class HostTransfer:
    """Device-to-host copies consumed on a worker thread (see the module docstring).

    Args:
        consume: ``consume(array, meta)``, called on the worker thread with a numpy view of the
            host copy (valid during the call only: copy what you keep) and the ``meta`` given to
            ``submit``.
        name: Names the worker thread and errors (the hook's name).
        slots: Host buffers in flight at most.
    """

    def __init__(self, consume: Callable[[np.ndarray, Any], None], name: str, slots: int = 4) -> None:
        self._consume = consume
        self.name = name
        self._free: queue.Queue[_Slot] = queue.Queue()
        for _ in range(max(1, int(slots))):
            self._free.put(_Slot())
        self._work: queue.Queue[Any] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"alchemi-{name}", daemon=True)
        self._thread.start()
        self._closed = False

    def submit(self, table: torch.Tensor, meta: Any = None) -> None:
        """Copy ``table`` (``[n, ...]``) to the host and queue it for ``consume``; never blocks on
        the device.

        Raises:
            HookWorkerError: An earlier ``consume`` failed, or the transfer is closed.
        """
        self._raise_error()
        if self._closed:
            raise HookWorkerError(f"{self.name}: submit after close; the run has ended")
        slot = self._free.get()
        dst = slot.host_view(table)
        if table.is_cuda:
            dst.copy_(table, non_blocking=True)
            if slot.event is None:
                slot.event = torch.cuda.Event()
            slot.event.record(torch.cuda.current_stream(table.device))
            ready = slot.event
        else:
            dst.copy_(table)
            ready = None
        self._work.put((slot, table.shape[0], meta, ready))

    def close(self) -> None:
        """Wait until everything submitted is consumed, stop the worker, raise its error if any."""
        if not self._closed:
            self._closed = True
            self._work.put(_STOP)
            self._thread.join()
        self._raise_error()

    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is _STOP:
                return
            slot, n, meta, ready = item
            try:
                if self._error is None:
                    if ready is not None:
                        ready.synchronize()
                    assert slot.host is not None
                    self._consume(slot.host[:n].numpy(), meta)
            except BaseException as exc:  # noqa: BLE001 - reported to the stepping thread
                self._error = exc
            finally:
                self._free.put(slot)

    def _raise_error(self) -> None:
        exc = self._error
        if exc is not None:
            self._error = None
            raise HookWorkerError(f"{self.name}: background writing failed: {exc!r}") from exc
