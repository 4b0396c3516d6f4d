"""``buffer:warp``: Warp kernels behind ``Batch.put``, ``defrag`` and ``zero`` (an implementation
of :class:`alchemi_core.data.buffer_ops.BufferOps`).

Rows of every dtype are copied as integer words (:mod:`alchemi_warp.words`), bit-identical to the
torch path, on torch's current stream, with no read-back. Core picks these ops for CUDA devices.
The shifted gather of index fields is one Warp kernel instead of torch's gather plus add (9.7x for
8.8M edges, ``benchmarks/bench_put_defrag.py``); plain row copies and zeroing stay on torch, which
is faster for them, unless ``every_op=True`` (the tests). On a CPU, Warp runs only when asked.

Example:
    >>> import torch
    >>> from alchemi_warp.buffer_ops import WarpBufferOps
    >>> ops = WarpBufferOps(allow_cpu=True, every_op=True)
    >>> out = torch.zeros(2, 3, dtype=torch.int64)
    >>> ops.gather(torch.arange(9).reshape(3, 3), torch.tensor([2, 0]), out)
    >>> out.tolist()
    [[6, 7, 8], [0, 1, 2]]
    >>> from alchemi_core.testing import make_batch
    >>> make_batch([2, 3]).zero(ops).num_graphs  # Batch.put/defrag/zero take ops=
    0
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from alchemi_core import warp_runtime
from alchemi_core.data.buffer_ops import TorchBufferOps
from alchemi_core.errors import InvalidDataError
from alchemi_warp import kernels, words

_TORCH = TorchBufferOps()
_SHIFTABLE = (torch.int64, torch.int32)


class WarpBufferOps:
    """Row copies by Warp kernels, for every dtype and trailing shape.

    Args:
        allow_cpu: Also claim CPU tensors (off by default: torch's CPU ``index_select`` is tight).
        every_op: Run plain gathers and zeroing with Warp kernels too (torch's are faster).

    Indices must lie inside ``src``: like every GPU gather, the kernels do not check them.
    """

    name = "warp"

    def __init__(self, allow_cpu: bool = False, every_op: bool = False) -> None:
        self.allow_cpu = allow_cpu
        self.every_op = every_op

    def supports(self, device: torch.device | str) -> bool:
        """True on CUDA devices Warp can use, and on the CPU when ``allow_cpu`` is set."""
        device = torch.device(device)
        if device.type == "cpu":
            return self.allow_cpu
        if device.type != "cuda":
            return False
        return warp_runtime.cuda_available()

    def gather(self, src: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> None:
        """``out[i] = src[index[i]]`` for every row of ``out``.

        Raises:
            InvalidDataError: ``src`` and ``out`` differ in dtype, trailing shape or device, or
                ``index`` does not have one entry per row of ``out``.
        """
        if not self.every_op:
            _TORCH.gather(src, index, out)  # measured faster for plain rows
            return
        index = _check(src, index, out, "gather")
        if not (src.is_contiguous() and out.is_contiguous()):
            _TORCH.gather(src, index, out)  # strided user tensors: correctness over speed
            return
        if out.numel() == 0:
            return
        width = words.word_bytes_for(src, out)
        out_words = words.as_words(out, width)
        warp_runtime.launch_tensors(kernels.gather_rows, out_words.shape, words.as_words(src, width), index, out_words)

    def gather_shifted(
        self, src: torch.Tensor, index: torch.Tensor, shift: torch.Tensor, out: torch.Tensor
    ) -> None:
        """``out[i] = src[index[i]] + shift[i]``: atom indices moved to their new offset.

        Raises:
            InvalidDataError: As :meth:`gather`, or ``shift`` does not have one entry per row.
        """
        index = _check(src, index, out, "gather_shifted")
        if shift.dim() != 1 or shift.shape[0] != out.shape[0] or shift.device != out.device:
            raise InvalidDataError(
                f"buffer:warp gather_shifted: shift has shape {list(shift.shape)} on {shift.device} but "
                f"out has {out.shape[0]} rows on {out.device}; pass one shift per row, on out's device"
            )
        if out.dtype not in _SHIFTABLE or not (src.is_contiguous() and out.is_contiguous()):
            # Only integer index fields are shifted; anything else keeps torch's semantics.
            _TORCH.gather_shifted(src, index, shift, out)
            return
        if out.numel() == 0:
            return
        # In the indices' dtype: int64 shifts wrap to int32 as torch's in-place add casts back.
        shift = shift if shift.dtype == out.dtype else shift.to(out.dtype)
        out_rows = words.as_rows(out)
        warp_runtime.launch_tensors(kernels.gather_rows_shifted, out_rows.shape, words.as_rows(src), index, shift, out_rows)

    def zero(self, tensors: Sequence[torch.Tensor]) -> None:
        """Set every element of every tensor to zero (False for bool); one launch per tensor."""
        if not self.every_op:
            _TORCH.zero(list(tensors))
            return
        for t in tensors:
            if t.numel() == 0:
                continue
            if not t.is_contiguous():
                t.zero_()
                continue
            flat = words.as_flat_words(t)
            warp_runtime.launch_tensors(kernels.fill_words, flat.shape, flat, _zero_word(flat))

    def __repr__(self) -> str:
        return f"WarpBufferOps(allow_cpu={self.allow_cpu}, every_op={self.every_op})"


_zero_words: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _zero_word(like: torch.Tensor) -> torch.Tensor:
    """A one-element zero of ``like``'s word dtype on its device, made once and kept."""
    key = (like.device, like.dtype)
    zero = _zero_words.get(key)
    if zero is None:
        zero = _zero_words[key] = torch.zeros(1, dtype=like.dtype, device=like.device)
    return zero


def _check(src: torch.Tensor, index: torch.Tensor, out: torch.Tensor, what: str) -> torch.Tensor:
    """Validate shapes, dtypes and devices on the host (metadata only, no device read)."""
    if src.dtype != out.dtype or src.shape[1:] != out.shape[1:]:
        raise InvalidDataError(
            f"buffer:warp {what}: source rows are {src.dtype} {list(src.shape[1:])} but destination "
            f"rows are {out.dtype} {list(out.shape[1:])}; both must have the same dtype and row shape"
        )
    if not (src.device == out.device == index.device):
        raise InvalidDataError(
            f"buffer:warp {what}: tensors are on {src.device} (src), {index.device} (index) and "
            f"{out.device} (out); move them to one device"
        )
    if index.dim() != 1 or index.shape[0] != out.shape[0]:
        raise InvalidDataError(
            f"buffer:warp {what}: index has shape {list(index.shape)} but out has {out.shape[0]} "
            "rows; pass one source row index per destination row"
        )
    if index.dtype == torch.int64:
        return index
    if index.dtype in (torch.int32, torch.int16, torch.int8, torch.uint8):
        return index.to(torch.int64)
    raise InvalidDataError(f"buffer:warp {what}: index must be an integer tensor, got {index.dtype}")

