"""Chunks of whole systems, each with its own COO edges, for evaluating a model piecewise (a
network's activations for the backward pass may not fit for a whole batch).

:class:`SystemChunks` groups the systems into chunks of at most ``max_atoms`` atoms; each
:class:`SystemChunk` reads like a batch (local indices) and holds a fixed-capacity *edge window*,
gathered from the batch's :class:`~alchemi_potentials.neighbors.edges.Edges` at every update
without host synchronisation. A plan belongs to one batch, ``batch.version`` and ``Edges`` object.

Example:
    >>> from alchemi_potentials.testing import copper_cells
    >>> from alchemi_core.data import Batch
    >>> from alchemi_potentials.neighbors import EdgeList
    >>> batch = Batch.from_atoms(copper_cells(5))        # 5 systems of 108 atoms
    >>> edges = EdgeList(cutoff=3.0).update(batch)
    >>> chunks = SystemChunks(max_atoms=250, padding_length=3.0).update(batch, edges)
    >>> [(c.first_system, c.num_graphs, c.num_nodes) for c in chunks]
    [(0, 2, 216), (2, 2, 216), (4, 1, 108)]
    >>> sum(int(c.edges.num_edges) for c in chunks) == int(edges.num_edges)
    True
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING

import numpy as np
import torch

from alchemi_core.errors import CapacityError, ConfigurationError
from alchemi_potentials.neighbors.edges import EDGE_HEADROOM, EDGES_MULTIPLE_OF, Edges

if TYPE_CHECKING:
    from alchemi_core.data import Batch


def group_systems(atoms_per_system: np.ndarray, max_atoms: int) -> list[tuple[int, int]]:
    """``[first, end)`` system ranges, in order, each of at most ``max_atoms`` atoms unless one
    system alone has more (it is then a range of its own).

    Example:
        >>> group_systems(np.array([3, 3, 5, 2, 9]), max_atoms=6)
        [(0, 2), (2, 3), (3, 4), (4, 5)]
    """
    ranges: list[tuple[int, int]] = []
    start, held = 0, 0
    for s, n in enumerate(atoms_per_system.tolist()):
        if s > start and held + n > max_atoms:
            ranges.append((start, s))
            start, held = s, 0
        held += n
    if len(atoms_per_system):
        ranges.append((start, len(atoms_per_system)))
    return ranges


class SystemChunk:
    """Systems ``[first_system, first_system + num_graphs)`` of a batch and their edge window
    (:attr:`edges`, brought up to date by :meth:`fill`)."""

    def __init__(self, batch: Batch, systems: tuple[int, int], atom_range: tuple[int, int], capacity: int,
                 padding_length: float, like: Edges, planned: int) -> None:
        s0, s1 = systems
        a0, a1 = atom_range
        self.first_system, self.num_graphs = s0, s1 - s0
        self.first_atom, self.num_nodes = a0, a1 - a0
        self._batch = batch
        dev = like.index.device
        self.batch_idx = (batch.batch_idx[a0:a1] - s0).contiguous()
        self.batch_ptr = (batch.batch_ptr[s0:s1 + 1] - a0).contiguous()
        self.capacity = capacity
        self.planned = planned  # the chunk's edges when the windows were sized
        slot = torch.arange(capacity, device=dev)
        self._slot = slot
        self._pad_atom = slot % max(1, self.num_nodes)
        self._pad_system = self.batch_idx[self._pad_atom]
        dt = like.padding.dtype
        self._pad_vector = torch.tensor([padding_length, 0.0, 0.0], dtype=dt, device=dev)
        self._zero = torch.zeros((), dtype=dt, device=dev)
        self._at = torch.zeros(capacity, dtype=torch.int64, device=dev)
        self._live = torch.zeros(capacity, dtype=torch.bool, device=dev)
        self._count = torch.zeros(1, dtype=torch.int32, device=dev)
        self.needed = torch.zeros(1, dtype=torch.int32, device=dev)  # most edges the window was asked to hold
        ends = like.ends
        assert ends is not None
        self._start = ends[a0 - 1:a0] if a0 > 0 else torch.zeros(1, dtype=ends.dtype, device=dev)
        self._stop = ends[a1 - 1:a1]
        self._end = torch.zeros(1, dtype=ends.dtype, device=dev)  # _stop within the edge list's capacity
        self.edges = Edges(
            torch.zeros((2, capacity), dtype=torch.int64, device=dev),
            torch.zeros((capacity, 3), dtype=like.unit_shifts.dtype, device=dev),
            torch.zeros(capacity, dtype=torch.int64, device=dev),
            torch.zeros((capacity, 3), dtype=dt, device=dev),
            self._count,
        )

    @property
    def atomic_numbers(self) -> torch.Tensor:
        return self._batch.atomic_numbers[self.first_atom:self.first_atom + self.num_nodes]

    def atoms(self, per_atom: torch.Tensor) -> torch.Tensor:
        """The chunk's rows of a ``[atoms, ...]`` tensor of the whole batch (a view)."""
        return per_atom[self.first_atom:self.first_atom + self.num_nodes]

    def systems(self, per_system: torch.Tensor) -> torch.Tensor:
        """The chunk's rows of a ``[systems, ...]`` tensor of the whole batch (a view)."""
        return per_system[self.first_system:self.first_system + self.num_graphs]

    def fill(self, edges: Edges) -> Edges:
        """Copy the chunk's edges out of the batch's (in place, no read-back) and return them."""
        at, live = self._at, self._live
        torch.sub(self._stop, self._start, out=self._count)
        torch.maximum(self.needed, self._count, out=self.needed)
        # Edges past the edge list's capacity were dropped (its verify says so): never copied.
        torch.clamp(self._stop, max=edges.capacity, out=self._end)
        torch.add(self._slot, self._start, out=at)
        torch.lt(at, self._end, out=live)
        at.clamp_(max=edges.capacity - 1)
        mine = self.edges
        torch.index_select(edges.index, 1, at, out=mine.index)
        mine.index.sub_(self.first_atom)
        torch.where(live, mine.index, self._pad_atom, out=mine.index)
        torch.index_select(edges.unit_shifts, 0, at, out=mine.unit_shifts)
        torch.where(live.unsqueeze(1), mine.unit_shifts, self._zero, out=mine.unit_shifts)
        torch.index_select(edges.system, 0, at, out=mine.system)
        mine.system.sub_(self.first_system)
        torch.where(live, mine.system, self._pad_system, out=mine.system)
        torch.where(live.unsqueeze(1), self._zero, self._pad_vector, out=mine.padding)
        torch.sub(self._end, self._start, out=self._count)
        self._count.clamp_(min=0, max=self.capacity)
        return mine


class SystemChunks:
    """Plans chunks of whole systems for a batch and fills their edge windows (module docstring).

    Args:
        max_atoms: Atoms per chunk at most (a larger system is a chunk of its own).
        padding_length: Length (Å) of padding edges' vectors (the edge list's, at least the
            model's cutoff).

    Raises:
        ConfigurationError: ``max_atoms`` is not a positive integer.
    """

    def __init__(self, max_atoms: int, padding_length: float) -> None:
        if isinstance(max_atoms, bool) or not isinstance(max_atoms, int) or max_atoms < 1:
            raise ConfigurationError(f"chunk_atoms must be a positive integer or None, got {max_atoms!r}")
        self.max_atoms = max_atoms
        self.padding_length = float(padding_length)
        self._batch: Batch | None = None  # the chunks hold it anyway
        self._version = -1
        self._edges: weakref.ref[Edges] | None = None
        self._chunks: list[SystemChunk] = []

    @property
    def chunks(self) -> list[SystemChunk]:
        """The chunks of the last update's batch."""
        return list(self._chunks)

    def update(self, batch: Batch, edges: Edges) -> list[SystemChunk]:
        """The chunks of ``batch`` with their windows filled from ``edges`` (the batch's, just
        updated); planned anew, with one read-back, when batch, systems or edges change."""
        held = None if self._edges is None else self._edges()
        if batch is not self._batch or batch.version != self._version or edges is not held:
            self._plan(batch, edges)
            self._batch, self._version, self._edges = batch, batch.version, weakref.ref(edges)
        for chunk in self._chunks:
            chunk.fill(edges)
        return self._chunks

    def _plan(self, batch: Batch, edges: Edges) -> None:
        counts = np.asarray(batch.num_nodes_per_system, dtype=np.int64)
        ranges = group_systems(counts, self.max_atoms)
        starts = np.concatenate([[0], np.cumsum(counts)])
        if edges.ends is None:
            raise ConfigurationError("SystemChunks needs the edges of a batch's EdgeList (they carry ends)")
        bounds = [int(starts[s1]) for _, s1 in ranges]
        ends = edges.ends[torch.tensor([b - 1 for b in bounds], device=edges.ends.device)].tolist() if bounds else []
        self._chunks = []
        # The windows keep the edge list's headroom, so a larger max_edges gives each more room.
        headroom = max(EDGE_HEADROOM, edges.capacity / max(1, ends[-1] if ends else 0))
        before = 0
        for (s0, s1), end in zip(ranges, ends, strict=True):
            need = end - before
            before = end
            capacity = -(-max(1, math.ceil(need * headroom)) // EDGES_MULTIPLE_OF) * EDGES_MULTIPLE_OF
            self._chunks.append(SystemChunk(batch, (s0, s1), (int(starts[s0]), int(starts[s1])), capacity,
                                            self.padding_length, edges, planned=need))

    def error_flag(self) -> torch.Tensor | None:
        """A ``[1]`` device tensor, True when some window was asked for more edges than it holds."""
        flags = [c.needed > c.capacity for c in self._chunks]
        if not flags:
            return None
        return torch.stack(flags).any().reshape(1)

    def verify(self) -> None:
        """Raise if a window overflowed (reads back).

        Raises:
            CapacityError: A chunk had more edges than its window holds (its results are wrong);
                the message names the ``max_edges`` that gives every window room.
        """
        total = sum(c.planned for c in self._chunks)
        for c in self._chunks:
            need = int(c.needed[0])
            if need > c.capacity:
                # max_edges sets the windows' headroom (see _plan): this one needs need/planned more
                fits = math.ceil(max(total, 1) * need / max(c.planned, 1) * EDGE_HEADROOM)
                raise CapacityError(
                    f"chunk edge window overflow: systems {c.first_system}-{c.first_system + c.num_graphs - 1} "
                    f"needed {need} edges but their window holds {c.capacity} (sized for the {c.planned} they had "
                    "when the chunks were planned), so edges were dropped and these results are wrong; pass "
                    f"max_edges={fits} (the windows take the edge list's headroom, "
                    "so this gives each of them room in proportion), or chunk_atoms=None"
                )

    def memory_bytes(self) -> int:
        """Device bytes of the windows."""
        total = 0
        for c in self._chunks:
            e = c.edges
            for t in (e.index, e.unit_shifts, e.system, e.padding, c._at, c._slot, c._pad_atom, c._pad_system):
                total += t.numel() * t.element_size()
        return total
