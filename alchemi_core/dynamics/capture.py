"""Capturing a CUDA graph the engine replays: the step's and the checks'.

``torch.cuda.graph`` prepares every capture for a program that captures once: it waits for the
device (``torch.cuda.synchronize``) and hands torch's cached memory back to the driver
(``empty_cache``), and each graph draws from a memory pool of its own. An inflight run captures
again whenever the set of systems changes (W3 at 100,000 cells: about a thousand captures, at
about 11 ms each for that preparation alone on the H200 under a host profiler, and the next
allocations then go back to ``cudaMalloc``). :func:`capture_graph` captures without either: on a side stream the engine keeps,
into the pool of the graph it replaces. That graph is never replayed again, so its temporaries'
memory can serve the new one (the sharing PyTorch documents as safe for graphs replayed in the
order they were captured), and the run's graph memory stays that of one graph.

Example:
    >>> with collector_held():
    ...     pass
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

T = TypeVar("T")


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


def gpu_index(device: torch.device) -> int:
    """The index of GPU ``device`` (``cuda`` without one: the current GPU)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def side_stream(held: torch.cuda.Stream | None, index: int) -> torch.cuda.Stream:
    """``held`` if it is a stream of GPU ``index``, else a new one there: the one side stream a
    capturer keeps (a new stream per capture would leave torch's allocator with blocks cached per
    stream)."""
    if held is None or held.device.index != index:
        return torch.cuda.Stream(device=index)
    return held


def capture_graph(
    record: Callable[[], T], stream: torch.cuda.Stream, replaces: torch.cuda.CUDAGraph | None = None
) -> tuple[torch.cuda.CUDAGraph, T]:
    """Capture what ``record`` launches as a CUDA graph; returns the graph and ``record``'s value.

    Args:
        record: Launches the device work; it must not read back or synchronise.
        stream: The side stream to capture on (not the default stream, which cannot capture).
            It first waits for the current stream, and the current stream for it after.
        replaces: The graph this one replaces: the caller never replays it again, and the new
            graph allocates from its memory pool. Drop it after the capture.

    Nothing waits for the device and no cached memory is released (see the module docstring);
    a caller that needs the memory (a large model's eager step before the capture) empties the
    cache itself. If ``record`` raises, the capture is ended and the exception passes on.
    """
    graph = torch.cuda.CUDAGraph()
    pool: Any = replaces.pool() if replaces is not None else None
    current = torch.cuda.current_stream()
    stream.wait_stream(current)
    with collector_held(), torch.cuda.stream(stream):
        if pool is None:
            graph.capture_begin()
        else:
            graph.capture_begin(pool=pool)
        try:
            out = record()
        except BaseException:
            with contextlib.suppress(Exception):  # the capture is invalid: end it, report record's error
                graph.capture_end()
            raise
        graph.capture_end()
    current.wait_stream(stream)
    return graph, out
