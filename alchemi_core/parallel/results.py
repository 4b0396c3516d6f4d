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

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import numpy as np

from alchemi_core.dynamics.sinks import DataSink, HostMemory
from alchemi_core.dynamics.stored import stored_results
from alchemi_core.errors import ConfigurationError


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


class SinkResults:
    """One sink as the results store of a single process (a ``ResultsStore`` of one part), so a
    rerun of ``alchemi run`` skips what is stored as a data-parallel one does.

    Args:
        sink: The sink (``ZarrData``, ``HostMemory``, ...): its records carry ``system_id`` and
            ``status``.
        frame_statuses: Statuses of records that are trajectory frames, not results.

    Raises:
        ConfigurationError: On ``committed_ids``, a sink that cannot list its ``system_id``s.

    Example:
        >>> from alchemi_core.dynamics import HostMemory
        >>> from alchemi_core.parallel.results import SinkResults
        >>> from alchemi_core.testing import make_batch
        >>> results = SinkResults(HostMemory(capacity=None))
        >>> results.sink(0).write(make_batch([2, 3]))
        >>> results.committed_ids().tolist()
        [0, 1]
    """

    def __init__(self, sink: DataSink, frame_statuses: Iterable[int] = ()) -> None:
        self._sink = sink
        self.frame_statuses = tuple(int(s) for s in frame_statuses)

    def sink(self, rank: int) -> DataSink:
        if int(rank) != 0:
            raise ConfigurationError(f"SinkResults holds the results of one process, not of rank {rank}")
        return self._sink

    def committed_ids(self) -> np.ndarray:
        ids = stored_results(self._sink, self.frame_statuses)
        if ids is None:
            raise ConfigurationError(
                f"{type(self._sink).__name__} cannot list the system_id of what it holds, so a rerun cannot skip "
                "what is stored; use sink:zarr"
            )
        return ids
