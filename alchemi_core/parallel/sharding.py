"""Deterministic shards of a dataset, balanced by atoms, for data-parallel runs.

Every rank computes every shard from the same inputs (the atom counts and the identities of the
structures still to do), so the ranks agree on who does what without talking, and any rank can
name the structures another rank held after that rank died.

Balancing is longest-processing-time first: structures in decreasing order of atoms (ties by
position), each to the shard with the fewest atoms so far (ties to the lowest rank). The largest
shard then exceeds the mean by less than one structure's atoms; with equal sizes it is a
round-robin.

Example:
    >>> import numpy as np
    >>> from alchemi_core.parallel import balanced_shards
    >>> shards = balanced_shards(np.array([10, 3, 8, 2, 7]), world_size=2)
    >>> [s.tolist() for s in shards]
    [[0, 1, 3], [2, 4]]
    >>> [int(np.array([10, 3, 8, 2, 7])[s].sum()) for s in shards]
    [15, 15]
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np
import torch

from alchemi_core.data import AtomicData
from alchemi_core.data.datapipes import all_metadata, as_atomic_data
from alchemi_core.errors import ConfigurationError, InvalidDataError


def balanced_shards(num_atoms: np.ndarray, world_size: int) -> list[np.ndarray]:
    """Split positions ``0..len(num_atoms)-1`` into ``world_size`` shards of nearly equal atoms.

    Args:
        num_atoms: Atoms of each structure.
        world_size: Number of shards (ranks).

    Returns:
        One int64 array of positions per rank, each in increasing order.

    Raises:
        ConfigurationError: ``world_size`` is below 1.
    """
    if int(world_size) < 1:
        raise ConfigurationError(f"world_size must be >= 1, got {world_size}")
    atoms = np.asarray(num_atoms, dtype=np.int64)
    order = np.argsort(-atoms, kind="stable")
    loads = [(0, r) for r in range(int(world_size))]
    owner = np.empty(len(atoms), dtype=np.int64)
    for i, n in zip(order.tolist(), atoms[order].tolist(), strict=True):
        load, rank = heapq.heappop(loads)
        owner[i] = rank
        heapq.heappush(loads, (load + n, rank))
    return [np.nonzero(owner == r)[0] for r in range(int(world_size))]


def dataset_ids(dataset: Any) -> np.ndarray:
    """The ``system_id`` of every structure of ``dataset``: its ``system_ids()`` when it has
    one, else the positions ``0..len-1`` (what ``SizeAwareSampler`` assigns)."""
    ids = getattr(dataset, "system_ids", None)
    out = np.asarray(ids(), dtype=np.int64) if callable(ids) else np.arange(len(dataset), dtype=np.int64)
    if len(out) != len(dataset):
        raise InvalidDataError(
            f"{type(dataset).__name__}.system_ids() gave {len(out)} ids for {len(dataset)} structures"
        )
    if len(np.unique(out)) != len(out):
        raise InvalidDataError(f"{type(dataset).__name__}.system_ids() repeats ids; every structure needs its own")
    return out


class ShardDataset:
    """The structures of ``dataset`` at ``positions``, each carrying its ``system_id``: what one
    rank's ``SizeAwareSampler`` reads.

    Args:
        dataset: The whole dataset (``len``, ``[i]``, ``get_metadata``).
        positions: Positions in ``dataset`` of this shard's structures.
        ids: Their system ids (``dataset_ids(dataset)[positions]``).
        num_atoms, num_edges: Their sizes (computed when not given).

    Raises:
        InvalidDataError: On loading, a structure carries a ``system_id`` other than its id.

    Example:
        >>> import numpy as np
        >>> from alchemi_core.data.datapipes import ListDataset
        >>> from alchemi_core.parallel import ShardDataset
        >>> from alchemi_core.testing import random_structures
        >>> shard = ShardDataset(ListDataset(random_structures([2, 3, 4])), np.array([2, 0]), np.array([2, 0]))
        >>> len(shard), shard.get_metadata(0), shard[0].system_id.tolist()
        (2, (4, 0), [2])
    """

    def __init__(
        self,
        dataset: Any,
        positions: np.ndarray,
        ids: np.ndarray,
        num_atoms: np.ndarray | None = None,
        num_edges: np.ndarray | None = None,
    ) -> None:
        self.dataset = dataset
        self.positions = np.asarray(positions, dtype=np.int64)
        self.ids = np.asarray(ids, dtype=np.int64)
        if num_atoms is None or num_edges is None:
            atoms, edges = all_metadata(dataset)
            num_atoms, num_edges = atoms[self.positions], edges[self.positions]
        self._atoms = np.asarray(num_atoms, dtype=np.int64)
        self._edges = np.asarray(num_edges, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, index: int) -> AtomicData:
        pos, sid = int(self.positions[index]), int(self.ids[index])
        data = as_atomic_data(self.dataset[pos], pos)
        if "system_id" in data:
            have = int(data.system_id.reshape(-1)[0])
            if have != sid:
                raise InvalidDataError(
                    f"structure {pos} of the dataset carries system_id {have}, but the data-parallel run "
                    f"knows it as {sid}; give the dataset a system_ids() method returning the ids its "
                    "structures carry"
                )
        else:
            data.system_id = torch.tensor([sid], dtype=torch.long)
        return data

    def get_metadata(self, index: int) -> tuple[int, int]:
        return int(self._atoms[index]), int(self._edges[index])

    def get_all_metadata(self) -> tuple[np.ndarray, np.ndarray]:
        return self._atoms, self._edges

    def system_ids(self) -> np.ndarray:
        return self.ids

    def get_all_system_ids(self) -> np.ndarray:
        return self.ids

    @property
    def num_atoms(self) -> int:
        """Atoms in the shard."""
        return int(self._atoms.sum())

    def __repr__(self) -> str:
        return f"ShardDataset({len(self)} structures, {self.num_atoms} atoms)"
