"""An in-process backend: ranks are threads of one process exchanging tensors through queues.

For unit tests and debugging a pipeline without launching processes. Sends copy the tensor, so
sender and receiver never share memory, exactly as over a wire.

Example:
    >>> import torch, threading
    >>> from alchemi_core.comm.inprocess import InProcessBackend
    >>> a, b = InProcessBackend.group(world_size=2)
    >>> a.isend_tensor(torch.arange(3), dst=1).wait()
    >>> out = torch.zeros(3, dtype=torch.long)
    >>> b.irecv_tensor(out, src=0).wait()
    >>> out.tolist()
    [0, 1, 2]
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import torch

from alchemi_core.comm.base import CommBackend, DoneWork, PeerError, Work
from alchemi_core.errors import PipelineError


class _Group:
    def __init__(self, world_size: int, timeout_s: float) -> None:
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.links: dict[tuple[int, int], queue.Queue[torch.Tensor]] = {}
        self.lock = threading.Lock()
        self.reduce_barrier = threading.Barrier(world_size, timeout=timeout_s)
        self.reduce_values: list[int] = [0] * world_size
        self.failed = threading.Event()
        self.failure: str | None = None

    def link(self, src: int, dst: int) -> queue.Queue[torch.Tensor]:
        with self.lock:
            return self.links.setdefault((src, dst), queue.Queue())


class _RecvWork(Work):
    def __init__(self, group: _Group, q: queue.Queue[torch.Tensor], out: torch.Tensor, src: int) -> None:
        self.group, self.q, self.out, self.src = group, q, out, src

    def done(self) -> bool:
        return not self.q.empty() or self.group.failed.is_set()

    def wait(self, timeout_s: float | None = None) -> None:
        limit = self.group.timeout_s if timeout_s is None else timeout_s
        waited = 0.0
        while True:
            try:
                data = self.q.get(timeout=0.05)
                break
            except queue.Empty:
                waited += 0.05
                if self.group.failed.is_set():
                    raise PeerError(f"stopping: {self.group.failure or f'rank {self.src} failed'}") from None
                if waited >= limit:
                    raise PeerError(f"no message from rank {self.src} within {limit:g} s", self.src) from None
        if data.shape != self.out.shape or data.dtype != self.out.dtype:
            raise PipelineError(
                f"received {data.dtype} {list(data.shape)} from rank {self.src} into a buffer of "
                f"{self.out.dtype} {list(self.out.shape)}: the ranks' buffers differ"
            )
        self.out.copy_(data)


class InProcessBackend(CommBackend):
    """One rank of an in-process group (make the group with :meth:`group`)."""

    name = "inprocess"

    def __init__(self, rank: int, group: _Group) -> None:
        self._rank = rank
        self._group = group

    @classmethod
    def group(cls, world_size: int, timeout_s: float = 60.0) -> list[InProcessBackend]:
        g = _Group(world_size, timeout_s)
        return [cls(r, g) for r in range(world_size)]

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._group.world_size

    def isend_tensor(self, tensor: torch.Tensor, dst: int) -> Work:
        self._group.link(self._rank, dst).put(tensor.detach().clone())
        return DoneWork()

    def irecv_tensor(self, tensor: torch.Tensor, src: int) -> Work:
        return _RecvWork(self._group, self._group.link(src, self._rank), tensor, src)

    def _reduce(self, value: int, op: Any) -> int:
        g = self._group
        g.reduce_values[self._rank] = int(value)
        try:
            g.reduce_barrier.wait()
            out = op(g.reduce_values)
            g.reduce_barrier.wait()
        except threading.BrokenBarrierError:
            raise PipelineError("a rank failed or timed out during a reduction") from None
        return int(out)

    def all_reduce_max(self, value: int) -> int:
        return self._reduce(value, max)

    def all_reduce_sum(self, value: int) -> int:
        return self._reduce(value, sum)

    def barrier(self) -> None:
        self._reduce(0, max)

    def notify_failure(self, message: str, rank: int | None = None) -> None:
        """Mark the group failed so every waiting rank stops with ``message``."""
        g = self._group
        if g.failure is None:
            g.failure = message
        g.failed.set()
        g.reduce_barrier.abort()

    def peer_failure(self) -> str | None:
        return self._group.failure

    def abort(self) -> None:
        """Mark the group failed so every waiting rank stops with an error."""
        self.notify_failure(self._group.failure or f"rank {self._rank} aborted")
