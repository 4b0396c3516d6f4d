"""Host buffers for device-to-host copies, allocated once and reused.

A sink or hook that copies device tensors to the host every N steps takes a
:class:`StagingSlot` with :meth:`HostStaging.acquire` (waiting while all are in use, which bounds
memory and applies back-pressure), copies into its buffers, and gives it back with
:meth:`HostStaging.release`: no pinned allocation per copy, which slows the stepping
(``python -m tools.w5_breakdown --variants copy,copy-new``). Buffers are pinned when the source
is on a GPU, grow when a larger tensor comes, and are kept otherwise.

Example:
    >>> import torch
    >>> staging = HostStaging(slots=2)
    >>> slot = staging.acquire()
    >>> host = slot.buffer("positions", torch.ones(4, 3))
    >>> _ = host.copy_(torch.ones(4, 3))
    >>> host.shape, slot.nbytes
    (torch.Size([4, 3]), 48)
    >>> staging.release(slot); staging.free
    2
"""

from __future__ import annotations

import queue
from collections.abc import Callable

import torch


class StagingSlot:
    """Named host buffers for one copy in flight (see the module docstring)."""

    __slots__ = ("_buffers",)

    def __init__(self) -> None:
        self._buffers: dict[str, tuple[torch.Tensor, bool]] = {}  # name -> (bytes, pinned)

    def reserve(self, nbytes: int, pinned: bool) -> None:
        """Called before the buffers of one copy are taken (``nbytes`` in all); a slot backed by
        one region (e.g. shared memory) makes room here. Separate buffers need nothing."""

    def buffer(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """A host tensor shaped and typed like ``like``, for ``name``'s copy; its memory is reused
        by the next copy of ``name`` into this slot (pinned when ``like`` is on a GPU)."""
        nbytes = like.numel() * like.element_size()
        pinned = like.is_cuda
        raw, was_pinned = self._buffers.get(name, (None, pinned))
        if raw is None or raw.numel() < nbytes or was_pinned != pinned:
            grown = max(nbytes, 2 * raw.numel() if raw is not None else 0, 1)
            raw = torch.empty(grown, dtype=torch.uint8, pin_memory=pinned)
            self._buffers[name] = (raw, pinned)
        return raw[:nbytes].view(like.dtype).view(like.shape)

    @property
    def nbytes(self) -> int:
        """Host memory the slot holds."""
        return sum(raw.numel() for raw, _ in self._buffers.values())


class HostStaging:
    """A fixed set of :class:`StagingSlot` s, taken and given back (thread-safe).

    Args:
        slots: Copies in flight at most; ``acquire`` waits while all are taken.
        make_slot: Makes slot ``i`` (another kind of slot, e.g. in shared memory).
    """

    def __init__(self, slots: int, make_slot: Callable[[int], StagingSlot] | None = None) -> None:
        self.slots = max(1, int(slots))
        self.all: list[StagingSlot] = [make_slot(i) if make_slot else StagingSlot() for i in range(self.slots)]
        self._free: queue.LifoQueue[StagingSlot] = queue.LifoQueue()  # the warmest slot first
        for slot in self.all:
            self._free.put(slot)

    def acquire(self) -> StagingSlot:
        """A free slot, waiting for one while all are in use."""
        return self._free.get()

    def release(self, slot: StagingSlot) -> None:
        """Give ``slot`` back; its buffers are overwritten by a later copy."""
        self._free.put(slot)

    @property
    def free(self) -> int:
        """Slots not in use now."""
        return self._free.qsize()
