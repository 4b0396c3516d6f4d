"""Python's garbage collector held off while a CUDA graph is captured (the step's and the checks').

Example:
    >>> with collector_held():
    ...     pass
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_held() -> Iterator[None]:
    """Python's cyclic garbage collector off for the duration of a capture.

    A collection that runs inside a capture may free a dead object that holds CUDA resources,
    such as the graph of an earlier run's stage caught in a reference cycle; destroying a graph
    (or freeing memory outside torch's allocator) is not allowed while a stream captures, and
    it invalidates the capture (seen on the H200: W1 failed in 2 of 3 benchmark processes with
    ``cudaErrorStreamCaptureInvalidated``). torch no longer collects before a capture
    by default (``torch.compiler.config.force_cudagraph_gc``), and a full collection per capture
    would cost W3's 100-odd captures dearly; holding the collector costs nothing, and whatever is
    dead is collected after the capture, where it is allowed.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
