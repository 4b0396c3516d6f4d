"""What a data-parallel run writes to: one results store, one part per writing rank.

A :class:`ResultsStore` gives each rank a sink of its own (``sink(rank)``) and answers, for the
whole store, which structures are already in it (``committed_ids()``). Readers see the union of
the parts as one set. ``alchemi-zarr``'s ``ShardedZarrStore`` is the implementation for files and
object stores; :class:`MemoryResults` holds the parts in this process (tests, examples).

Example:
    >>> from alchemi_core.parallel import MemoryResults
    >>> from alchemi_core.testing import make_batch
    >>> results = MemoryResults()
    >>> results.sink(0).write(make_batch([2, 3]))
    >>> results.committed_ids().tolist()
    [0, 1]
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from alchemi_core.dynamics.sinks import DataSink, HostMemory


@runtime_checkable
class ResultsStore(Protocol):
    """A store that several ranks write at once, each to its own part."""

    def sink(self, rank: int) -> DataSink:
        """The sink rank ``rank`` writes its finished structures to (its own part)."""
        ...

    def committed_ids(self) -> np.ndarray:
        """The ``system_id`` of every record committed in any part (int64; an id twice if it
        was written twice)."""
        ...


def committed_count(results: ResultsStore) -> int:
    """Records committed in ``results`` (its own ``committed_count()`` when it has a cheap one)."""
    count = getattr(results, "committed_count", None)
    return int(count()) if callable(count) else len(results.committed_ids())


class MemoryResults:
    """Parts kept as :class:`HostMemory` sinks in this process (a ``ResultsStore``)."""

    def __init__(self) -> None:
        self.parts: dict[int, HostMemory] = {}

    def sink(self, rank: int) -> DataSink:
        return self.parts.setdefault(int(rank), HostMemory(capacity=None))

    def committed_ids(self) -> np.ndarray:
        ids = [part.read().system_id.reshape(-1).numpy() for part in self.parts.values() if len(part)]
        return np.concatenate(ids).astype(np.int64) if ids else np.zeros(0, dtype=np.int64)

    def committed_count(self) -> int:
        return sum(len(part) for part in self.parts.values())
