"""``EdgeList``: the COO edges of message-passing models, from the batched cell list.

Edge ``e`` goes from ``sender[e]`` to ``receiver[e]`` with vector ``positions[receiver] -
positions[sender] + unit_shifts[e] @ cell`` (ASE's ``"ijS"``): every pair closer than the cutoff,
once each way, and no other. The buffers have a fixed capacity (no allocation or read-back per
step); the tail holds *padding edges*, an atom to itself with vector ``(padding_length, 0, 0)``,
which change no result of a model whose terms vanish there (:meth:`Edges.vectors` adds it).

Example:
    >>> from ase.build import bulk
    >>> from alchemi_core.data import Batch
    >>> from alchemi_potentials.neighbors import EdgeList
    >>> batch = Batch.from_atoms([bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2)])
    >>> edges = EdgeList(cutoff=3.0, skin=0.5).update(batch)
    >>> int(edges.num_edges)        # 32 atoms, 12 nearest neighbours each
    384
    >>> edges.vectors(batch.positions, batch.cell).norm(dim=1)[:384].max() < 3.0
    tensor(True)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import attrs
import torch

from alchemi_core import warp_runtime as _warp
from alchemi_core.errors import CapacityError, ConfigurationError
from alchemi_potentials.neighbors.cell_list import BatchedNeighborList
from alchemi_potentials.tuning import PotentialsTuning

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: Edge capacity kept beyond the edges seen when the list sizes itself.
EDGE_HEADROOM = 1.2
#: Edge capacity comes in multiples of this.
EDGES_MULTIPLE_OF = 64


@attrs.frozen
class Edges:
    """COO edges of a batch, valid until the next :meth:`EdgeList.update`.

    Attributes:
        index: ``[2, capacity]`` int64: row 0 the senders, row 1 the receivers.
        unit_shifts: ``[capacity, 3]`` integer lattice shifts, in the positions' dtype.
        system: ``[capacity]`` int64, the system of each edge.
        padding: ``[capacity, 3]`` zero for real edges, ``(padding_length, 0, 0)`` for padding.
        count: ``[1]`` int32 on the device: the real edges, which come first.
        ends: ``[atoms]`` int32, the real edges through each slot (system ``s``'s end at
            ``ends[batch_ptr[s + 1] - 1]``); None except for a batch's edge list.
    """

    index: torch.Tensor
    unit_shifts: torch.Tensor
    system: torch.Tensor
    padding: torch.Tensor
    count: torch.Tensor
    ends: torch.Tensor | None = None

    @property
    def sender(self) -> torch.Tensor:
        return self.index[0]

    @property
    def receiver(self) -> torch.Tensor:
        return self.index[1]

    @property
    def capacity(self) -> int:
        return int(self.index.shape[1])

    @property
    def num_edges(self) -> torch.Tensor:
        """The real edges, as a device tensor (reading it back synchronises)."""
        return self.count[0]

    @property
    def mask(self) -> torch.Tensor:
        """``[capacity]`` bool, True for real edges (allocates: for tests and inspection)."""
        return torch.arange(self.capacity, device=self.index.device) < self.count[0]

    def cartesian_shifts(self, cell: torch.Tensor) -> torch.Tensor:
        """``unit_shifts @ cell[system] + padding`` (``cell``: ``[B, 3, 3]``; may carry a strain)."""
        shifts = self.unit_shifts.to(cell.dtype)  # a no-op unless the model computes in another precision
        return torch.bmm(shifts.unsqueeze(1), cell[self.system]).squeeze(1) + self.padding.to(cell.dtype)

    def vectors(self, positions: torch.Tensor, cell: torch.Tensor) -> torch.Tensor:
        """``[capacity, 3]`` edge vectors ``positions[receiver] - positions[sender] + shift``."""
        return positions[self.receiver] - positions[self.sender] + self.cartesian_shifts(cell)


class _Buffers:
    """Edge buffers and recorded launches for one neighbour matrix."""

    def __init__(self, capacity: int, num_atoms: int, like: torch.Tensor) -> None:
        dev, dt = like.device, like.dtype
        self.capacity = capacity
        self.index = torch.zeros((2, capacity), dtype=torch.int64, device=dev)
        self.unit_shifts = torch.zeros((capacity, 3), dtype=dt, device=dev)
        self.system = torch.zeros(capacity, dtype=torch.int64, device=dev)
        self.padding = torch.zeros((capacity, 3), dtype=dt, device=dev)
        self.per_slot = torch.zeros(max(1, num_atoms), dtype=torch.int32, device=dev)
        self.ends = torch.zeros(max(1, num_atoms), dtype=torch.int32, device=dev)
        self.overflow = torch.zeros(1, dtype=torch.int32, device=dev)
        self.edges = Edges(self.index, self.unit_shifts, self.system, self.padding,
                           self.ends[max(0, num_atoms - 1):][:1], self.ends)
        self.launches: dict[tuple[int, ...], tuple[_warp.LaunchSequence, _warp.LaunchSequence]] = {}
        self.matrix: Any = None

    def nbytes(self) -> int:
        held = [self.index, self.unit_shifts, self.system, self.padding, self.per_slot, self.ends, self.overflow]
        return sum(t.numel() * t.element_size() for t in held)


class EdgeList:
    """COO edges within ``cutoff`` for every system of a batch (see the module docstring).

    Args:
        cutoff: Edges are the pairs closer than this (Å).
        skin: Verlet skin of the neighbour list underneath (Å).
        max_neighbors: Columns of that neighbour list (None: sized from the structures).
        max_edges: Edge capacity. None sizes it from the structures when the set of systems
            changes (one read-back then, with 20 % headroom); a number never reads back (CUDA
            graphs), and :meth:`verify` raises if more edges were ever needed.
        padding_length: Length (Å) of the padding edges' vectors; default the cutoff.
        tuning: The neighbour list's per-device choices (default: ``PotentialsTuning.for_device``
            of the batch's device; ``alchemi_potentials.tuning``).

    Raises:
        ConfigurationError: A bad cutoff, skin, max_edges or padding length.
    """

    def __init__(self, cutoff: float, skin: float = 0.5, max_neighbors: int | None = None,
                 max_edges: int | None = None, padding_length: float | None = None,
                 tuning: PotentialsTuning | None = None) -> None:
        self.neighbor_list = BatchedNeighborList(cutoff, skin, max_neighbors, half_list=False, tuning=tuning)
        if max_edges is not None and int(max_edges) < 1:
            raise ConfigurationError(f"max_edges must be a positive integer or None, got {max_edges!r}")
        length = float(cutoff if padding_length is None else padding_length)
        if not (length >= cutoff and math.isfinite(length)):
            raise ConfigurationError(
                f"padding_length must be finite and at least the cutoff ({cutoff} Å), got {padding_length!r}"
            )
        self._cutoff = float(cutoff)
        self._skin = float(skin)
        self._fixed_capacity = None if max_edges is None else int(max_edges)
        self.padding_length = length
        self._buffers: _Buffers | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_buffers"] = None
        return state

    @property
    def cutoff(self) -> float:
        return self._cutoff

    @property
    def skin(self) -> float:
        return self._skin

    @property
    def capacity(self) -> int | None:
        """Edge capacity now (None before the first update)."""
        return None if self._buffers is None else self._buffers.capacity

    def __repr__(self) -> str:
        mode = "auto" if self._fixed_capacity is None else "fixed"
        return f"EdgeList(cutoff={self._cutoff}, skin={self.skin}, capacity={self.capacity} ({mode}))"

    def update(self, batch: Batch) -> Edges:
        """Bring the edges up to date with ``batch``'s positions and cells and return them (with
        ``max_edges=None``, a new set of systems' first update reads back its edge count)."""
        matrix = self.neighbor_list.update(batch)
        pos = batch.positions
        buffers = self._buffers
        fresh = buffers is None or buffers.matrix is not matrix or buffers.index.device != pos.device \
            or buffers.unit_shifts.dtype != pos.dtype
        if fresh:
            capacity = self._fixed_capacity or EDGES_MULTIPLE_OF
            buffers = self._buffers = _Buffers(capacity, batch.num_nodes, pos)
            buffers.matrix = matrix
        assert buffers is not None
        if batch.num_nodes == 0:
            return buffers.edges
        self._run(buffers, batch)
        if fresh and self._fixed_capacity is None:
            need = int(buffers.ends[batch.num_nodes - 1])
            if need > buffers.capacity:
                capacity = -(-math.ceil(need * EDGE_HEADROOM) // EDGES_MULTIPLE_OF) * EDGES_MULTIPLE_OF
                buffers = self._buffers = _Buffers(capacity, batch.num_nodes, pos)
                buffers.matrix = matrix
                self._run(buffers, batch)
        return buffers.edges

    def _run(self, buffers: _Buffers, batch: Batch) -> None:
        from alchemi_potentials.neighbors import edge_kernels as k

        nl = self.neighbor_list
        layout = nl._require(batch)
        pos = batch.positions
        cell = nl.last_cell
        assert cell is not None
        atom_system = batch.batch_idx
        key = (pos.data_ptr(), cell.data_ptr(), atom_system.data_ptr(), id(layout.matrix))
        seqs = buffers.launches.get(key)
        if seqs is None:
            wp = _warp.warp()
            f64 = pos.dtype == torch.float64
            scalar, vec, mat = (wp.float64, wp.vec3d, wp.mat33d) if f64 else (wp.float32, wp.vec3f, wp.mat33f)
            P, C = _warp.view(pos, vec), _warp.view(cell, mat)
            pl = layout.matrix.pair_list
            wrap = layout.atoms.wrap
            n = batch.num_nodes
            cut2 = wp.float64(self._cutoff**2)
            per_slot, ends = _warp.view(buffers.per_slot), _warp.view(buffers.ends)
            outs = [_warp.view(buffers.index[0]), _warp.view(buffers.index[1]), _warp.view(buffers.unit_shifts, vec),
                    _warp.view(buffers.system), _warp.view(buffers.padding, vec)]
            first = _warp.LaunchSequence(P.device, who="alchemi-potentials")
            first.add(k.count_edges, n, [pl, wrap, P, C, cut2, per_slot])
            then = _warp.LaunchSequence(P.device, who="alchemi-potentials")
            then.add(k.write_edges, n, [pl, wrap, P, C, cut2, ends, per_slot, buffers.capacity, *outs,
                                        _warp.view(buffers.overflow)])
            then.add(k.pad_edges, buffers.capacity, [ends, n - 1, _warp.view(atom_system), scalar(self.padding_length),
                                                      *outs])
            seqs = buffers.launches[key] = (first, then)
        stream = _warp.stream_for(pos.device)
        first, then = seqs
        first.run(stream)
        torch.cumsum(buffers.per_slot[: batch.num_nodes], 0, dtype=torch.int32, out=buffers.ends[: batch.num_nodes])
        then.run(stream)

    def verify(self, batch: Batch) -> None:
        """Raise what the device recorded (reads back; the engine calls it at check steps).

        Raises:
            CapacityError: More edges than ``max_edges`` were needed (edges were dropped), or
                the neighbour list underneath overflowed.
            InvalidDataError: What :meth:`BatchedNeighborList.verify` raises.
        """
        self.neighbor_list.verify(batch)
        b = self._buffers
        if b is None:
            return
        need = int(b.overflow[0])
        if need > b.capacity:
            raise CapacityError(
                f"edge list overflow: the batch needed {need} edges within {self._cutoff:g} Å but the capacity is "
                f"{b.capacity}, so edges were dropped and these results are wrong; pass max_edges="
                f"{math.ceil(need * EDGE_HEADROOM)} (or None, to size it from the structures)"
            )

    def error_flag(self, batch: Batch) -> torch.Tensor | None:
        """A 0-d device tensor, True when :meth:`verify` may raise (no read-back); None before the
        first update for ``batch``."""
        listed = self.neighbor_list.error_flag(batch)
        b = self._buffers
        if listed is None or b is None:
            return None
        return listed | (b.overflow[0] > b.capacity)

    def memory_bytes(self) -> int:
        """Device bytes of the edges and the neighbour list underneath."""
        return self.neighbor_list.memory_bytes() + (0 if self._buffers is None else self._buffers.nbytes())
