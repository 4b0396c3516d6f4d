"""Helpers for tests that run on a CUDA device."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def no_host_sync() -> Iterator[None]:
    """Inside the block, any CUDA call that synchronises with the host raises (torch's sync
    debug mode); the work queued before it is finished first, so only the block is judged.

    Example:
        >>> with no_host_sync():  # doctest: +SKIP
        ...     dynamics.step(batch)
    """
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")
