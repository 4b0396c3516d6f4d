"""The row-copy primitives behind ``Batch.put``, ``defrag``, ``index_select`` and ``zero``.

Core ships a torch implementation that works on every device and dtype. A plugin can register a
faster one as ``buffer:<name>`` (``alchemi-warp`` registers ``buffer:warp``); core picks the
registered implementation for devices it declares it supports, and keeps the torch path for the
rest. Both must give bit-identical results: they only move rows.

Example:
    >>> import torch
    >>> from alchemi_core.data.buffer_ops import TorchBufferOps
    >>> out = torch.zeros(2, 3)
    >>> TorchBufferOps().gather(torch.arange(9.0).reshape(3, 3), torch.tensor([2, 0]), out)
    >>> out[0].tolist()
    [6.0, 7.0, 8.0]
"""

from __future__ import annotations

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


_TORCH = TorchBufferOps()
_chosen: dict[str, BufferOps] = {}


def buffer_ops_for(device: torch.device) -> BufferOps:
    """The row-copy implementation used for ``device``: an installed ``buffer:*`` plugin that
    supports it, else torch. The choice is made once per device type."""
    key = device.type
    ops = _chosen.get(key)
    if ops is not None:
        return ops
    ops = _TORCH
    if key != "cpu":
        # CPU stays on torch: index_select is already a tight loop there, and Warp's CPU
        # kernels would add compile time for no gain.
        try:
            from alchemi_core import registry

            for record in registry.available("buffer"):
                if record.name == "torch":
                    continue
                candidate = registry.build(f"buffer:{record.name}")
                if candidate.supports(device):
                    ops = candidate
                    break
        except Exception:  # noqa: BLE001 - a broken optional accelerator must not break copies
            ops = _TORCH
    _chosen[key] = ops
    return ops


def set_buffer_ops(device_type: str, ops: BufferOps | None) -> None:
    """Force the implementation for a device type (tests and benchmarks); None resets."""
    if ops is None:
        _chosen.pop(device_type, None)
    else:
        _chosen[device_type] = ops
