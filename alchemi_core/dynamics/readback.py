"""A check's one read-back: a few flags copied to the host, with host work done while they come.

At a check the host has launched the steps since the last one and the check's measurement; the
GPU is still working through them. A blocking ``tolist()`` would leave the host idle until it is
done. :class:`FlagReadBack` copies the flags into pinned host memory without blocking and, until
the copy has arrived, calls ``idle()`` (the engine's: the sampler builds the structures the next
refill will likely take), one short piece of work at a time, so the wait ends at most one piece
late. A health check of a run without checks sends its codes the same
way (:meth:`FlagReadBack.start`, :class:`~alchemi_core.dynamics.quarantine.PendingCodes`).

Example:
    >>> import torch
    >>> FlagReadBack().read(torch.tensor([True, False]), idle=lambda: False)
    [True, False]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class FlagReadBack:
    """The pinned buffer and event of an engine's check read-backs (see the module docstring)."""

    def __init__(self) -> None:
        self._host: torch.Tensor | None = None
        self._event: Any = None

    def read(self, flags: torch.Tensor, idle: Callable[[], bool] | None = None,
             meanwhile: Callable[[], None] | None = None) -> list[Any]:
        """``flags`` as a list, calling ``idle()`` while they are on their way (it returns False
        when it has nothing left to do). A CPU tensor is read at once.

        ``meanwhile()`` runs once the copy is on its way and before the wait: device work queued
        there (the engine's next step, run ahead) runs on the GPU while the host acts on the flags,
        and the copy does not wait for it.
        """
        if flags.device.type != "cuda":
            out = flags.tolist()
            if meanwhile is not None:
                meanwhile()
            return out
        host, event = self.start(flags)
        if meanwhile is not None:
            meanwhile()
        if idle is not None:
            while not event.query() and idle():
                pass
        event.synchronize()
        return host.tolist()

    def start(self, flags: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Copy ``flags`` (on a GPU) into the pinned buffer without blocking; the buffer and the
        event recorded after the copy (both reused by the next call)."""
        host = self._host
        if host is None or host.shape != flags.shape or host.dtype != flags.dtype:
            host = self._host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=True)
            self._event = torch.cuda.Event()
        host.copy_(flags, non_blocking=True)
        self._event.record()
        return host, self._event
