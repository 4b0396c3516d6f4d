"""Communication between pipeline ranks: the backend interface and an in-process backend.

Transports over torch.distributed (``comm:nccl``, ``comm:gloo``) come from ``alchemi-nccl``.

Example:
    >>> from alchemi_core.comm import CommBackend
    >>> from alchemi_core.comm.inprocess import InProcessBackend
    >>> issubclass(InProcessBackend, CommBackend)
    True
"""

from __future__ import annotations

from alchemi_core.comm.base import CommBackend, DoneWork, PeerError, Work

__all__ = ["CommBackend", "DoneWork", "PeerError", "Work"]
