"""Move small tables from the device to a background consumer without stalling the step.

``HostTransfer.submit(table, meta)`` enqueues a non-blocking copy of ``table`` into a reused
pinned buffer behind a CUDA event; a worker thread waits on that event, then hands the host copy
to ``consume(array, meta)``, in order. When every buffer waits for the consumer, ``submit`` waits
for one. An exception in ``consume`` is raised, as :class:`HookWorkerError`, by the next
``submit`` or by ``close``.

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

from alchemi_core.data.staging import HostStaging
from alchemi_hooks.errors import HookWorkerError

_STOP = object()


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
        self._staging = HostStaging(slots)
        self._events: dict[int, Any] = {}  # one CUDA event per slot, reused
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
        slot = self._staging.acquire()
        dst = slot.buffer("table", table)
        ready = None
        if table.is_cuda:
            dst.copy_(table, non_blocking=True)
            ready = self._events.get(id(slot))
            if ready is None:
                ready = self._events[id(slot)] = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(table.device))
        else:
            dst.copy_(table)
        self._work.put((slot, dst, meta, ready))

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
            slot, host, meta, ready = item
            try:
                if self._error is None:
                    if ready is not None:
                        ready.synchronize()
                    self._consume(host.numpy(), meta)
            except BaseException as exc:  # noqa: BLE001 - reported to the stepping thread
                self._error = exc
            finally:
                self._staging.release(slot)

    def _raise_error(self) -> None:
        exc = self._error
        if exc is not None:
            self._error = None
            raise HookWorkerError(f"{self.name}: background writing failed: {exc!r}") from exc
