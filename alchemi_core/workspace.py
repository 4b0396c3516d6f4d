"""``Workspace``: scratch tensors a component reuses from step to step, so a warm step
allocates nothing.

Integrators, hooks and models keep their per-step temporaries (noise, per-system sums, scaled
forces) here instead of allocating them: a buffer is sized to the batch's capacity, reallocated
only when a larger one (or another dtype, shape or device) is asked for, and the same view
object comes back while nothing changed, so Warp launches recorded on it can be replayed and a
captured CUDA graph keeps reading it.
"""

from __future__ import annotations

import torch


class Workspace:
    """Named scratch tensors kept between steps (see the module docstring).

    Example:
        >>> ws = Workspace()
        >>> ws.get("noise", 10, 64, (3,), torch.float32, torch.device("cpu")).shape
        torch.Size([10, 3])
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._views: dict[str, tuple[int, torch.Tensor]] = {}

    def get(
        self, name: str, rows: int, capacity: int, tail: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """The first ``rows`` rows of buffer ``name`` (reallocated only when it is too small or
        of another dtype, shape or device). The same view object comes back while nothing
        changed, so kernels recorded on it can be replayed."""
        buf = self._buffers.get(name)
        if (
            buf is None
            or buf.shape[0] < rows
            or buf.shape[1:] != tail
            or buf.dtype != dtype
            or buf.device != device
        ):
            buf = torch.empty((max(rows, capacity), *tail), dtype=dtype, device=device)
            self._buffers[name] = buf
            self._views.pop(name, None)
        view = self._views.get(name)
        if view is None or view[0] != rows:
            view = (rows, buf[:rows])
            self._views[name] = view
        return view[1]

    def clear(self) -> None:
        self._buffers.clear()
        self._views.clear()


