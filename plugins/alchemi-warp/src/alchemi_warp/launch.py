"""Launching Warp kernels on torch tensors: zero-copy arguments, torch's current stream.

The runtime itself (stream wrappers, recorded launches) is core's ``alchemi_core.warp_runtime``,
shared with every plugin; these are the names this package calls it by.

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

from alchemi_core.warp_runtime import cuda_available, launch_tensors, stream_for

__all__ = ["cuda_available", "run", "warp_stream"]

#: One kernel on torch tensors, its recorded launch replayed with new arguments (core's runtime).
run = launch_tensors
#: Torch's current stream on a device as a Warp stream (cached per stream, in core).
warp_stream = stream_for
