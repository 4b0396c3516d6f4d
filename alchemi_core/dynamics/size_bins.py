"""``SizeBins``: a dataset's structures by size, for the sampler's best fit and its prefetch plan.

Structures are grouped into bins of ``width`` atoms, each bin in hand-out order. :meth:`take`
removes the first structure of the highest bin that fits the budgets. Each bin remembers the
fewest atoms of a structure it holds, so a budget that ends inside a bin's range below
everything in it skips the bin at once instead of scanning it.

Example:
    >>> import numpy as np
    >>> bins = SizeBins(np.array([3, 5, 8, 2]), np.zeros(4, dtype=np.int64), width=2, order=range(4))
    >>> bins.take(6, None), bins.take(6, None), len(bins)
    (1, 0, 2)
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np


class SizeBins:
    """Structure indices by size (see the module docstring).

    Args:
        atoms: Atoms of every structure of the dataset.
        edges: Edges of every structure.
        width: Atoms per bin.
        order: The indices to hold, in hand-out order.
    """

    def __init__(self, atoms: np.ndarray, edges: np.ndarray, width: int, order: Iterable[int]) -> None:
        self.atoms, self.edges, self.width = atoms, edges, int(width)
        #: Each bin's indices, in hand-out order (a bin is removed when it empties).
        self.queues: dict[int, deque[int]] = {}
        for i in order:
            self.queues.setdefault(int(atoms[i]) // self.width, deque()).append(i)
        #: Per bin: the fewest atoms of a structure in it and how many have that many (lazy).
        self.smallest: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def __bool__(self) -> bool:
        return bool(self.queues)

    def take(self, num_atoms: int, num_edges: int | None) -> int | None:
        """The first structure of the highest bin that fits the budgets, removed (None: none fits)."""
        if num_atoms < 1:
            return None
        top = num_atoms // self.width
        for b in sorted((k for k in self.queues if k <= top), reverse=True):
            if b == top and self.fewest_atoms(b) > num_atoms:
                continue  # the budget ends inside this bin's range, below all it holds
            queue = self.queues[b]
            for pos, i in enumerate(queue):
                if self.atoms[i] <= num_atoms and (num_edges is None or self.edges[i] <= num_edges):
                    del queue[pos]
                    self._taken_from(b, i)
                    return i
        return None

    def fewest_atoms(self, b: int) -> int:
        """The fewest atoms of a structure left in bin ``b`` (O(1) but when it changed)."""
        entry = self.smallest.get(b)
        if entry is None:
            sizes = self.atoms[np.fromiter(self.queues[b], dtype=np.int64)]
            least = int(sizes.min())
            entry = self.smallest[b] = [least, int((sizes == least).sum())]
        return entry[0]

    def _taken_from(self, b: int, i: int) -> None:
        if not self.queues[b]:
            del self.queues[b]
            self.smallest.pop(b, None)
            return
        entry = self.smallest.get(b)
        if entry is not None and int(self.atoms[i]) == entry[0]:
            entry[1] -= 1
            if entry[1] == 0:
                del self.smallest[b]  # found again when next asked

    def likely(self, heads: int, atoms: int, limit: int) -> Iterator[int]:
        """What coming requests will likely take, most likely first: the first ``heads`` of each
        bin (a refill's gap fillers), then best fit into ``atoms`` atoms (refills of whole
        batches), at most ``limit`` structures in all. It reads the bins live: make a new one
        after a :meth:`take`."""
        keys = sorted(self.queues, reverse=True)
        count = 0
        for b in keys:
            for i in itertools.islice(self.queues[b], heads):
                yield i
                count += 1
        for b in keys:
            for i in self.queues[b]:
                if count >= limit or atoms < self.fewest_atoms(b):
                    break  # the plan is full, or nothing more of this bin fits
                if self.atoms[i] <= atoms:
                    yield i
                    atoms -= int(self.atoms[i])
                    count += 1
