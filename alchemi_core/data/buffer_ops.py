"""The row-copy primitives behind ``Batch.put``, ``defrag`` and ``zero``.

Core ships a torch implementation that works on every device and dtype. A plugin can register a
faster one as ``buffer:<name>`` (``alchemi-warp`` registers ``buffer:warp``); core picks the
registered implementation for devices it declares it supports, and keeps the torch path for the
rest; each of those methods also takes ``ops=`` explicitly. Both must give bit-identical
results: they only move rows.

Example:
    >>> import torch
    >>> from alchemi_core.data.buffer_ops import TorchBufferOps
    >>> out = torch.zeros(2, 3)
    >>> TorchBufferOps().gather(torch.arange(9.0).reshape(3, 3), torch.tensor([2, 0]), out)
    >>> out[0].tolist()
    [6.0, 7.0, 8.0]
"""

from __future__ import annotations

import functools
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class BufferOps(Protocol):
    """Row copies for every dtype. ``out`` is always a contiguous prefix slice of a buffer."""

    def supports(self, device: torch.device) -> bool:
        """True when these ops run on ``device``."""
        ...

    def gather(self, src: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> None:
        """``out[i] = src[index[i]]`` for every row ``i`` of ``out``."""
        ...

    def gather_shifted(
        self, src: torch.Tensor, index: torch.Tensor, shift: torch.Tensor, out: torch.Tensor
    ) -> None:
        """``out[i] = src[index[i]] + shift[i]`` (atom indices moved to a new offset)."""
        ...

    def zero(self, tensors: list[torch.Tensor]) -> None:
        """Set every element of every tensor to zero (False for bool)."""
        ...


class TorchBufferOps:
    """The portable implementation: ``torch.index_select`` into the destination slice."""

    name = "torch"

    def supports(self, device: torch.device) -> bool:
        return True

    def gather(self, src: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> None:
        if out.is_contiguous():
            torch.index_select(src, 0, index, out=out)
        else:  # pragma: no cover - buffers are contiguous; kept for safety with user tensors
            out.copy_(src.index_select(0, index))

    def gather_shifted(
        self, src: torch.Tensor, index: torch.Tensor, shift: torch.Tensor, out: torch.Tensor
    ) -> None:
        self.gather(src, index, out)
        out.add_(shift.view(-1, *([1] * (out.dim() - 1))))

    def zero(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            t.zero_()


@functools.cache
def _ops_for_type(device_type: str) -> BufferOps:
    if device_type == "cpu":
        # torch's index_select is already a tight loop there; Warp's CPU kernels only add compile time.
        return TorchBufferOps()
    try:
        from alchemi_core import registry

        for record in registry.available("buffer"):
            if record.name != "torch":
                candidate = registry.build(f"buffer:{record.name}")
                if candidate.supports(torch.device(device_type)):
                    return candidate
    except Exception:  # noqa: BLE001 - a broken optional accelerator must not break copies
        pass
    return TorchBufferOps()


def buffer_ops_for(device: torch.device) -> BufferOps:
    """The row copies ``Batch`` uses on ``device`` unless given others: an installed ``buffer:*``
    plugin that supports it, else torch. Looked up once per device type."""
    return _ops_for_type(device.type)
