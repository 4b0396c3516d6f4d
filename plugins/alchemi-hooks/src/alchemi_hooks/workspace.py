"""Scratch tensors a hook reuses from step to step, so a step allocates nothing once warm.

Example:
    >>> import torch
    >>> from alchemi_hooks.workspace import Workspace
    >>> ws = Workspace()
    >>> a = ws.get("norms", (4, 1), torch.float32, torch.device("cpu"))
    >>> a is ws.get("norms", (4, 1), torch.float32, torch.device("cpu"))
    True
"""

from __future__ import annotations

import torch


class Workspace:
    """Named buffers, reallocated only when the requested shape, dtype or device changes."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The buffer ``name`` with exactly this shape (contents undefined)."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape != shape or buf.dtype != dtype or buf.device != device:
            buf = torch.empty(shape, dtype=dtype, device=device)
            self._buffers[name] = buf
        return buf
