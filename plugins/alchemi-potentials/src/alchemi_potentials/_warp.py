"""The bridge to Warp: initialisation, zero-copy views of torch tensors, torch's stream, and
kernel launches recorded once and replayed with little Python overhead.

Everything here imports Warp on first use only, so importing the package stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

_ready = False


def warp() -> Any:
    """The ``warp`` module, initialised on first use."""
    global _ready
    import warp as wp

    if not _ready:
        wp.init()
        _ready = True
    return wp


def view(tensor: torch.Tensor, dtype: Any = None) -> Any:
    """A Warp array sharing ``tensor``'s memory (``dtype`` e.g. ``wp.vec3`` for ``[N, 3]``)."""
    wp = warp()
    return wp.from_torch(tensor, dtype=dtype) if dtype is not None else wp.from_torch(tensor)


def stream_for(device: torch.device) -> Any:
    """Torch's current stream on ``device`` as a Warp stream (None on the CPU).

    Launching there orders Warp kernels with the torch operations around them and lets a CUDA
    graph captured on that stream include them.
    """
    if device.type != "cuda":
        return None
    current = torch.cuda.current_stream(device)
    key = (current.device_index, current.cuda_stream)
    stream = _streams.get(key)
    if stream is None:
        # Wrapping registers the stream with Warp: do it once per torch stream, not per call.
        # (The wrapper keeps its torch stream alive, so a cached handle is never reused.)
        if len(_streams) >= _MAX_STREAMS:
            del _streams[next(iter(_streams))]
        stream = _streams[key] = warp().stream_from_torch(current)
    return stream


_streams: dict[tuple[int, int], Any] = {}
_MAX_STREAMS = 32


class LaunchSequence:
    """Kernel launches recorded once (``wp.launch(..., record_cmd=True)``) and replayed.

    Replaying a recorded launch skips Warp's per-call argument packing, which dominates the cost
    of launching a small kernel from Python. A sequence is recorded for fixed arrays and sizes;
    build a new one when they change.

    Example:
        >>> seq = LaunchSequence(device)
        >>> seq.add(kernel, dim=n, inputs=[a, b])
        >>> seq.run(stream)
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        self._commands: list[Any] = []

    def add(self, kernel: Any, dim: int, inputs: Sequence[Any]) -> None:
        """Record one launch (nothing runs); a launch over zero threads is dropped."""
        if dim <= 0:
            return
        cmd = warp().launch(kernel, dim=dim, inputs=list(inputs), device=self.device, record_cmd=True)
        self._commands.append(cmd)

    def run(self, stream: Any = None) -> None:
        """Launch every recorded kernel, in order, on ``stream`` (the device's default if None)."""
        for cmd in self._commands:
            cmd.launch(stream)

    def __len__(self) -> int:
        return len(self._commands)
