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
    >>> launch.run(kernels.fill_words, (1, 6), as_words(out.reshape(1, 6), 4), kernels.WARP_WORDS[4](0))
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


def run(kernel: Any, dim: int | Sequence[int], *args: torch.Tensor | Any) -> None:
    """Launch ``kernel`` over ``dim`` threads with ``args`` (tensors are passed zero-copy).

    The first argument must be a tensor; its device is the launch device.
    """
    _init()
    device = args[0].device
    inputs = [
        wp.from_torch(a.detach(), requires_grad=False) if isinstance(a, torch.Tensor) else a for a in args
    ]
    if device.type == "cuda":
        wp.launch(kernel, dim=dim, inputs=inputs, stream=warp_stream(device))
    else:
        wp.launch(kernel, dim=dim, inputs=inputs, device="cpu")
