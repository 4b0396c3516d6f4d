"""Capturing a CUDA graph the engine replays: the step's and the checks'.

``torch.cuda.graph`` prepares every capture for a program that captures once: it waits for the
device and hands torch's cached memory back to the driver, and each graph draws from a memory
pool of its own. An inflight run captures again whenever the set of systems changes, so
:func:`capture_graph` captures without either: on the thread's side stream for that GPU
(:func:`capture_stream`), into the pool of the graph it replaces. That graph is never replayed
again, so its memory can serve the new one (the sharing PyTorch documents as safe for graphs
replayed in the order they were captured), and the run's graph memory stays that of one graph.

A run's last graphs are never replayed either once it ends. Dropped, their pools' memory would stay
reserved by torch for those pools alone, and the next run's captures would ask the driver again:
:func:`retire_graph` keeps a few such graphs per GPU (:data:`SPARE_GRAPHS`) and the next capture
with nothing to replace draws from a spare's pool. Where torch already holds much of the GPU's
memory (a large model's step), no graph is kept.

Example:
    >>> with collector_held():
    ...     pass
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from alchemi_core.dynamics.streams import thread_stream

T = TypeVar("T")


@contextlib.contextmanager
def collector_held() -> Iterator[None]:
    """Python's cyclic garbage collector off for the duration of a capture.

    A collection that runs inside a capture may free a dead object that holds CUDA resources,
    such as the graph of an earlier run's stage caught in a reference cycle; destroying a graph
    is not allowed while a stream captures, and it invalidates the capture
    (``cudaErrorStreamCaptureInvalidated``). Whatever is dead is collected after the capture.
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


def capture_stream(index: int) -> torch.cuda.Stream:
    """The side stream this thread warms up and captures on, on GPU ``index``: one per thread and
    GPU, shared by every engine and run. torch's allocator caches blocks per stream, and a graph's
    pool serves only captures on the stream its blocks were made on: with a stream per engine,
    each ended run's graph memory (and its eager warm-up's cached blocks) would be of no use to the
    next run's."""
    return thread_stream("capture", index)


#: Graphs of ended runs kept per GPU for their memory pools (see the module docstring).
SPARE_GRAPHS = 2
#: Unused cached device memory (as a fraction of the device's) above which a capture first hands
#: it back to the driver, and above which torch holds too much for ended runs' graphs to be kept.
CACHED_FRACTION_RELEASED = 0.1
_spares: dict[int, list[torch.cuda.CUDAGraph]] = {}
_spares_lock = threading.Lock()


def retire_graph(graph: torch.cuda.CUDAGraph | None, index: int) -> None:
    """``graph`` will never be replayed again (its run ended): keep it as a spare of GPU ``index``
    whose memory pool the next capture there draws from, or drop it (spares enough, or torch
    holds much of the GPU's memory)."""
    if graph is None or holds_much_memory(torch.device("cuda", index)):
        return
    with _spares_lock:
        kept = _spares.setdefault(index, [])
        if len(kept) < SPARE_GRAPHS:
            kept.append(graph)


def _take_spare(index: int) -> torch.cuda.CUDAGraph | None:
    with _spares_lock:
        kept = _spares.get(index)
        return kept.pop() if kept else None


def drop_spares() -> None:
    """Forget every spare graph (their pools' memory is freed when torch next releases cached
    memory, as ``torch.cuda.empty_cache()`` does)."""
    with _spares_lock:
        _spares.clear()


def holds_much_memory(device: torch.device) -> bool:
    """Whether torch holds more than :data:`CACHED_FRACTION_RELEASED` of the device's memory."""
    reserved, _allocated = pool_bytes(device)
    return reserved > CACHED_FRACTION_RELEASED * total_memory(device)


def pool_bytes(device: torch.device) -> tuple[int, int]:
    """The bytes torch's caching allocator reserves on ``device`` and the bytes of them in use
    (one read of the allocator's counters)."""
    stats = torch.cuda.memory_stats_as_nested_dict(device)
    reserved = stats.get("reserved_bytes", {}).get("all", {}).get("current", 0)
    allocated = stats.get("allocated_bytes", {}).get("all", {}).get("current", 0)
    return int(reserved), int(allocated)


def total_memory(device: torch.device) -> int:
    return int(torch.cuda.get_device_properties(device).total_memory)


def release_cached_memory(device: torch.device) -> None:
    """Return the caching allocator's unused blocks to the driver when they are many.

    The eager step before a capture leaves its temporaries in torch's shared pool, which the
    graph's private pool cannot draw from; for a large model (a MACE step takes gigabytes) the
    captured step would otherwise need its memory twice over. Small runs skip this (it
    synchronises, and their blocks are worth keeping).
    """
    reserved, allocated = pool_bytes(device)
    if reserved - allocated > CACHED_FRACTION_RELEASED * total_memory(device):
        torch.cuda.empty_cache()


def capture_graph(
    record: Callable[[], T], stream: torch.cuda.Stream, replaces: torch.cuda.CUDAGraph | None = None,
    spare: bool = True,
) -> tuple[torch.cuda.CUDAGraph, T]:
    """Capture what ``record`` launches as a CUDA graph; returns the graph and ``record``'s value.

    Args:
        record: Launches the device work; it must not read back or synchronise.
        stream: The side stream to capture on (not the default stream, which cannot capture).
            It first waits for the current stream, and the current stream for it after.
        replaces: The graph this one replaces: the caller never replays it again, and the new
            graph allocates from its memory pool. Drop it after the capture.
        spare: Without ``replaces``, draw from the pool of an ended run's graph on this GPU, if
            one was kept (:func:`retire_graph`).

    Nothing waits for the device and no cached memory is released (see the module docstring);
    a caller that needs the memory (a large model's eager step before the capture) empties the
    cache itself. If ``record`` raises, the capture is ended and the exception passes on.
    """
    graph = torch.cuda.CUDAGraph()
    if replaces is None and spare:
        replaces = _take_spare(stream.device.index)
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
