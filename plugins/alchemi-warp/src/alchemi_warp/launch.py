"""Launching Warp kernels on torch tensors: zero-copy arguments, torch's current stream.

Tensors are handed to Warp through ``wp.from_torch`` (no copy, no gradient arrays). On CUDA the
launch goes to ``torch.cuda.current_stream()``, so it is ordered with the torch work around it
and can be captured in a CUDA graph together with it; the Warp wrapper of each torch stream is
made once and reused, because building one costs more than the launch itself.

Example:
    >>> import torch
    >>> from alchemi_warp import kernels, launch
    >>> from alchemi_warp.words import as_words
    >>> out = torch.ones(2, 3)
    >>> words = as_words(out.reshape(1, 6), 4)[0]
    >>> launch.run(kernels.fill_words, words.shape, words, torch.zeros(1, dtype=torch.int32))
    >>> out.sum().item()
    0.0
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch
import warp as wp

_lock = threading.Lock()
_initialised = False
_streams: dict[tuple[int, int], Any] = {}
# Recorded launches are mutated per call (new arguments), so each thread keeps its own.
_local = threading.local()


def _init() -> None:
    """Initialise Warp once (it would otherwise initialise lazily inside ``from_torch``)."""
    global _initialised
    if not _initialised:
        with _lock:
            if not _initialised:
                wp.init()
                _initialised = True


def cuda_available() -> bool:
    """True when Warp can launch kernels on a CUDA device."""
    _init()
    return bool(wp.is_cuda_available())


def warp_stream(device: torch.device) -> Any:
    """The Warp stream wrapping torch's current stream on ``device`` (cached per stream)."""
    torch_stream = torch.cuda.current_stream(device)
    key = (torch_stream.device_index, torch_stream.cuda_stream)
    stream = _streams.get(key)
    if stream is None:
        # The wrapper keeps the torch stream alive, so its handle cannot be reused by another.
        stream = wp.stream_from_torch(torch_stream)
        _streams[key] = stream
    return stream


def run(kernel: Any, dim: Sequence[int], *args: torch.Tensor) -> None:
    """Launch ``kernel`` over ``dim`` threads with tensor ``args`` (passed zero-copy).

    The first tensor's device is the launch device. Callers pass integer tensors (word views),
    so no gradient arrays are ever made.

    The first launch of a kernel overload on a device records a ``wp.Launch``; later launches
    only replace its arguments with array descriptors (``from_torch(..., return_ctype=True)``)
    and replay it. That is about ten times less host work than ``wp.launch`` with ``wp.array``
    arguments, which matters because these copies are short and launch-bound on a GPU.
    """
    _init()
    device = args[0].device
    key = (kernel, device, *(a.dtype for a in args))
    launches = _local.__dict__.setdefault("launches", {})
    entry = launches.get(key)
    stream = warp_stream(device) if device.type == "cuda" else None
    dim = tuple(dim)
    if entry is None:
        inputs = [wp.from_torch(a, requires_grad=False) for a in args]
        target = stream.device if stream is not None else "cpu"
        entry = launches[key] = [wp.launch(kernel, dim=dim, inputs=inputs, device=target, record_cmd=True), dim]
    else:
        recorded = entry[0]
        for i, a in enumerate(args):
            recorded.set_param_at_index_from_ctype(i, wp.from_torch(a, return_ctype=True))
        if entry[1] != dim:  # rebuilding the launch bounds costs as much as the launch
            recorded.set_dim(dim)
            entry[1] = dim
    entry[0].launch(stream)
