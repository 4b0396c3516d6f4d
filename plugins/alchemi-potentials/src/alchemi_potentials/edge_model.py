"""``EdgeModel``: what machine-learned and other message-passing potentials share.

A subclass gives the systems' energies from positions, cells and COO edges
(:meth:`EdgeModel.energies`); this base class keeps the edges (:class:`EdgeList`) and takes forces
``F = -dE/dx`` and stress ``dE/d(eps) / V`` (symmetric strain ``eps`` on positions and cell;
positive under tension, NaN without volume) by automatic differentiation. The forward makes no
host synchronisation, so a step can be captured in a CUDA graph where the model allows it
(:attr:`cuda_graphs`). Inputs are cast to the model's dtype, results back to the positions'.

Example:
    >>> class Springs(EdgeModel):                       # a toy: E = sum over edges of r^2 / 4
    ...     def energies(self, batch, positions, cell, edges):
    ...         r2 = (edges.vectors(positions, cell) ** 2).sum(1)
    ...         live = torch.arange(edges.capacity) < edges.count
    ...         per_edge = torch.where(live, r2, torch.zeros_like(r2)) / 4
    ...         return torch.zeros(batch.num_graphs, dtype=r2.dtype).index_add(0, edges.system, per_edge)
    >>> from ase.build import bulk
    >>> from alchemi_core.data import Batch
    >>> model = Springs(cutoff=3.0, name="springs")
    >>> out = model(Batch.from_atoms([bulk("Cu", "fcc", a=3.61, cubic=True)]), compute_stress=True)
    >>> sorted(out)
    ['energy', 'forces', 'stress']
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Union

import torch

from alchemi_core.errors import InvalidDataError
from alchemi_core.models.base import BaseModel, ModelCard
from alchemi_potentials.cueq import KernelChoice
from alchemi_potentials.neighbors import EdgeList
from alchemi_potentials.neighbors.chunks import SystemChunk, SystemChunks
from alchemi_potentials.neighbors.edges import Edges

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: What :meth:`EdgeModel.energies` reads systems from: the batch, or a chunk of its systems.
Systems = Union["Batch", SystemChunk]


def cell_volumes(cell: torch.Tensor) -> torch.Tensor:
    """``[B]`` ``|det(cell)|`` by the triple product (no solver, so no host synchronisation)."""
    return torch.linalg.vecdot(cell[:, 0], torch.linalg.cross(cell[:, 1], cell[:, 2])).abs()


class EdgeModel(BaseModel):
    """Base class of models that read COO edges (see the module docstring).

    Args:
        cutoff: Edge cutoff in Å (the model's).
        name: Name on the model card.
        species: Atomic numbers the model knows (None: any).
        dtype: The model's floating-point dtype (None: the positions').
        skin: Verlet skin (Å) of the neighbour list under the edges.
        max_neighbors: Columns of that neighbour list (None: sized from the structures).
        max_edges: Edge capacity (None: sized from the structures; a number for CUDA graphs).
        padding_length: Length (Å) of padding edges' vectors (default: the cutoff).
        chunk_atoms: Evaluate a batch of more atoms than this in chunks of whole systems, one
            chunk's activations held at a time (None: whole batches;
            :mod:`~alchemi_potentials.neighbors.chunks`).
    """

    #: The step may be captured in a CUDA graph (the model's code reads nothing back).
    cuda_graphs: ClassVar[bool] = True
    #: Device bytes per atom of one step in float32, deliberately high;
    #: :meth:`measure_bytes_per_atom` replaces it by a measurement.
    BYTES_PER_ATOM: ClassVar[float] = 1e6
    #: The same on cuEquivariance's kernels (models whose network may run on them).
    BYTES_PER_ATOM_CUEQ: ClassVar[float] = 1e6
    #: When the network runs on cuEquivariance's kernels; None for a model that never does.
    _kernels: KernelChoice | None = None

    def __init__(self, *, cutoff: float, name: str, species: tuple[int, ...] | None = None,
                 dtype: torch.dtype | None = None, skin: float = 0.5, max_neighbors: int | None = None,
                 max_edges: int | None = None, padding_length: float | None = None,
                 chunk_atoms: int | None = None) -> None:
        super().__init__()
        self.edge_list = EdgeList(cutoff, skin, max_neighbors, max_edges, padding_length)
        self._chunking = None if chunk_atoms is None else SystemChunks(chunk_atoms, self.edge_list.padding_length)
        self.dtype = dtype
        self.card = ModelCard(name=name, cutoff=float(cutoff), periodic=True, stress=True, species=species)
        self._no_cell: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}
        self._measured: float | None = None

    # ------------------------------------------------------------------ to implement
    def energies(self, batch: Systems, positions: torch.Tensor, cell: torch.Tensor, edges: Edges) -> torch.Tensor:
        """``[B]`` energies (eV), differentiable in ``positions`` and ``cell`` (in the model's
        dtype; edge vectors ``edges.vectors(positions, cell)``). ``batch`` may be a chunk
        (:class:`~alchemi_potentials.neighbors.chunks.SystemChunk`): read only ``num_graphs``,
        ``num_nodes``, ``atomic_numbers``, ``batch_idx`` and ``batch_ptr``."""
        raise NotImplementedError  # pragma: no cover

    # ------------------------------------------------------------------ the forward
    def forward(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        """Energies ``[B, 1]``, forces ``[V, 3]`` and, when asked, stress ``[B, 3, 3]``."""
        edges = self.edge_list.update(batch)
        pos_in = batch.positions
        cell = self._cell(batch, self.dtype or pos_in.dtype)
        chunking = self._chunking
        if chunking is None or batch.num_nodes <= chunking.max_atoms:
            energy, forces, stress = self._evaluate(batch, pos_in, cell, edges, compute_stress)
        else:  # one forward and backward per chunk: one chunk's activations are held at a time
            chunks = chunking.update(batch, edges)
            parts = [self._evaluate(c, c.atoms(pos_in), c.systems(cell), c.edges, compute_stress) for c in chunks]
            energy = torch.cat([p[0] for p in parts])
            forces = torch.cat([p[1] for p in parts])
            stress = torch.cat([p[2] for p in parts if p[2] is not None]) if compute_stress else None
        out_dtype = pos_in.dtype
        out = {"energy": energy.to(out_dtype).unsqueeze(1), "forces": forces.to(out_dtype)}
        if stress is not None:
            out["stress"] = stress.to(out_dtype)
        return out

    def _evaluate(self, systems: Systems, pos_in: torch.Tensor, cell: torch.Tensor, edges: Edges,
                  compute_stress: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Energies ``[B]``, forces and stress (or None) of ``systems``: one forward and backward."""
        dtype = cell.dtype
        with torch.enable_grad():
            pos = pos_in.detach().to(dtype).requires_grad_(True)
            wrt = [pos]
            if compute_stress:
                strain = torch.zeros((systems.num_graphs, 3, 3), dtype=dtype, device=pos.device, requires_grad=True)
                sym = 0.5 * (strain + strain.transpose(1, 2))
                x = pos + torch.bmm(pos.unsqueeze(1), sym[systems.batch_idx]).squeeze(1)
                c = cell + torch.bmm(cell, sym)
                wrt.append(strain)
            else:
                x, c = pos, cell
            energy = self.energies(systems, x, c, edges)
            grads = torch.autograd.grad(energy.sum(), wrt, allow_unused=True)
        forces = grads[0]
        forces = torch.zeros_like(pos) if forces is None else -forces
        stress = None
        if compute_stress:
            g = grads[1] if grads[1] is not None else torch.zeros_like(cell)
            stress = g / cell_volumes(cell).view(-1, 1, 1)
        return energy.detach(), forces, stress

    def _cell(self, batch: Batch, dtype: torch.dtype) -> torch.Tensor:
        if "cell" in batch:
            return batch.cell.detach().to(dtype)
        key = (batch.num_graphs, dtype, batch.positions.device)
        zero = self._no_cell.get(key)
        if zero is None:
            zero = torch.zeros((batch.num_graphs, 3, 3), dtype=dtype, device=batch.positions.device)
            self._no_cell[key] = zero
        return zero

    # ------------------------------------------------------------------ checks
    def check_batch(self, batch: Batch) -> None:
        """Reject unknown species and periodic systems without a usable cell (reads back).

        Raises:
            InvalidDataError: Positions that are not floating point, species the model does not
                know, or a degenerate periodic cell.
        """
        if not batch.positions.is_floating_point():
            raise InvalidDataError(
                f"{self.card.name}: positions must be float32 or float64, got {batch.positions.dtype}"
            )
        super().check_batch(batch)  # species and cells

    @property
    def chunk_atoms(self) -> int | None:
        """Atoms per chunk at most, or None when a batch is evaluated whole."""
        return None if self._chunking is None else self._chunking.max_atoms

    @property
    def chunking(self) -> SystemChunks | None:
        """The chunk planner (its ``chunks`` are the last chunked batch's), or None."""
        return self._chunking

    def verify(self, batch: Batch) -> None:
        """Raise what the edge list (and chunks' edge windows) recorded on the device."""
        self.edge_list.verify(batch)
        if self._chunking is not None:
            self._chunking.verify()

    def error_flag(self, batch: Batch) -> torch.Tensor | None:
        """True on the device when :meth:`verify` may raise (the engine reads it at checks)."""
        flag = self.edge_list.error_flag(batch)
        windows = None if self._chunking is None else self._chunking.error_flag()
        if flag is None or windows is None:
            return flag
        return flag | windows[0]

    def bytes_per_atom(self) -> float:
        """Device bytes one atom needs in a step: measured (:meth:`measure_bytes_per_atom`), else
        the class's estimate for the kernels the network will run on, scaled to its precision."""
        if self._measured is not None:
            return self._measured
        per_atom = self.BYTES_PER_ATOM_CUEQ if self._kernels is not None and self._kernels.expected() else self.BYTES_PER_ATOM
        return per_atom * (2 if self.dtype == torch.float64 else 1)

    @property
    def uses_cueq(self) -> bool:
        """Whether the network runs on cuEquivariance's kernels (unasked: decided at its first call)."""
        return self._kernels is not None and self._kernels.converted

    def measure_bytes_per_atom(self, batch: Batch, headroom: float = 1.25) -> float:
        """Measure the peak device memory per atom (with ``headroom``) of a step with stress on
        ``batch``'s GPU; :meth:`bytes_per_atom` returns it from then on (on a CPU: the estimate).

        Example:
            >>> model.measure_bytes_per_atom(batch.to("cuda"))   # doctest: +SKIP
            3.1e5
        """
        device = batch.positions.device
        if device.type != "cuda" or batch.num_nodes == 0:
            return self.bytes_per_atom()
        self(batch, compute_stress=True)  # warm: buffers of this batch, kernels, caches
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        self(batch, compute_stress=True)
        torch.cuda.synchronize(device)
        held = self.memory_bytes()  # the edges belong to the step too
        self._measured = headroom * (torch.cuda.max_memory_allocated(device) - base + held) / batch.num_nodes
        return self._measured

    def memory_bytes(self) -> int:
        """Device bytes of the edges and neighbour list (not the network's activations)."""
        windows = 0 if self._chunking is None else self._chunking.memory_bytes()
        return self.edge_list.memory_bytes() + windows
