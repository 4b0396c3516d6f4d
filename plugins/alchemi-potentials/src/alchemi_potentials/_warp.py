"""The bridge to Warp: initialisation, zero-copy views of torch tensors, torch's stream, and
kernel launches recorded once and replayed.

Everything here imports Warp on first use only, so importing the package stays cheap.

Warp 1.5 (the oldest version supported) writes a float literal in a kernel as a float32
constant, even inside ``wp.float64(...)``: kernels of this package therefore use only literals
that float32 holds exactly (small integers, powers of two) and take other numbers as arguments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from alchemi_core.errors import AlchemiError, MissingDependencyError

_ready = False


class KernelLaunchError(AlchemiError, RuntimeError):
    """Warp could not prepare a kernel for a device (its module failed to build or load)."""


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


def require_device(device: torch.device) -> None:
    """Raise a clear error where Warp cannot run kernels on ``device``.

    Raises:
        MissingDependencyError: A CPU device where this Warp build has no CPU compiler.
    """
    if device.type == "cpu" and not warp().is_cpu_available():
        raise MissingDependencyError(
            "alchemi-potentials: this warp-lang build cannot run kernels on the CPU (it has no CPU "
            "compiler); move the batch to a CUDA device (batch.to('cuda')) or install the warp-lang "
            "wheel from PyPI, which includes the CPU backend"
        )


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


def _threads(dim: int | Sequence[int]) -> int:
    return math.prod(dim) if isinstance(dim, Sequence) else int(dim)


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
        self.names: list[str] = []

    def add(self, kernel: Any, dim: int | Sequence[int], inputs: Sequence[Any]) -> None:
        """Record one launch (nothing runs); a launch over zero threads is dropped.

        Raises:
            KernelLaunchError: Warp returned no launch: the kernel's module could not be built
                or loaded for this device (the first attempt raised the cause).
        """
        if _threads(dim) <= 0:
            return  # Warp records nothing for an empty grid (it returns None)
        cmd = warp().launch(kernel, dim=dim, inputs=list(inputs), device=self.device, record_cmd=True)
        if cmd is None:
            raise KernelLaunchError(
                f"alchemi-potentials: Warp could not prepare kernel {kernel.key!r} for device {self.device}: "
                "building or loading its module failed earlier (see the first error; on a CPU device "
                "Warp needs its CPU compiler, on a GPU a working CUDA driver)"
            )
        self._commands.append(cmd)
        self.names.append(kernel.key)

    def run(self, stream: Any = None) -> None:
        """Launch every recorded kernel, in order, on ``stream`` (the device's default if None)."""
        for cmd in self._commands:
            cmd.launch(stream)

    def __len__(self) -> int:
        return len(self._commands)
