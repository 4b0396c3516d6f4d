"""Data parallelism: every rank runs the whole workflow on a shard of the dataset, and all
ranks write one results store (see docs/data-parallel.md).

Example:
    >>> from alchemi_core.parallel import balanced_shards
    >>> [s.tolist() for s in balanced_shards([5, 5, 5, 5], world_size=2)]
    [[0, 2], [1, 3]]
"""

from __future__ import annotations

from alchemi_core.parallel.results import MemoryResults, ResultsStore, SinkResults, committed_count
from alchemi_core.parallel.runner import (
    DataParallelError,
    DataParallelSummary,
    PeerWatch,
    Progress,
    RankContext,
    print_progress,
    rank_device,
    run_data_parallel,
)
from alchemi_core.parallel.sharding import ShardDataset, balanced_shards, dataset_ids

__all__ = [
    "DataParallelError",
    "DataParallelSummary",
    "MemoryResults",
    "PeerWatch",
    "Progress",
    "RankContext",
    "ResultsStore",
    "ShardDataset",
    "SinkResults",
    "balanced_shards",
    "committed_count",
    "dataset_ids",
    "print_progress",
    "rank_device",
    "run_data_parallel",
]
