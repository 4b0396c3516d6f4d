"""``Ewald`` (``model:ewald``) and ``PME`` (``model:pme``): the Coulomb energy of per-atom charges
in periodic cells, split by a Gaussian of width ``1/alpha`` into a real-space sum over alchemi's
edges within ``cutoff`` and a reciprocal-space sum (Ewald: over k-vectors; PME: on an FFT mesh),
both from nvalchemi-toolkit-ops. Energies in eV (charges in e, lengths in Å); forces and
stress by autograd through the ops functions (:class:`~alchemi_potentials.edge_model.EdgeModel`).

Accuracy: one ``accuracy`` (the relative size of the neglected terms, ``exp(-(alpha rc)^2)``)
fixes, with the ``cutoff`` ``rc``, ``alpha = sqrt(-ln accuracy) / rc`` and the reciprocal cutoff
``k_max = 2 alpha sqrt(-ln accuracy)`` (PME: ops' mesh estimate for that alpha and accuracy).
When the batch's systems change, the k-vectors' Miller indices (Ewald) or the mesh (PME) and
the largest system's size are set from the cells then (one read-back); a step reads nothing
back on alchemi's side or, by ops' documented contract (Miller indices, an explicit mesh and
``max_atoms_per_system`` given), on ops'. Under a changing cell the k-vectors follow the cell;
their number and the mesh stay as set.

Systems must be periodic in all three directions (use ``model:dsf`` for molecules and slabs)
and neutral overall for a meaningful energy (a net charge gets ops' uniform background).

Example:
    >>> from ase.build import bulk
    >>> from alchemi_core.data import Batch
    >>> nacl = bulk("NaCl", "rocksalt", a=5.64, cubic=True)
    >>> nacl.set_initial_charges([1, -1] * 4)
    >>> out = Ewald(cutoff=8.0, accuracy=1e-8)(Batch.from_atoms([nacl]))
    >>> round(float(out["energy"]) / 4, 4)   # per ion pair: -1.747565 * 14.3996 / 2.82
    -8.9235
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import torch

from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_electrostatics.charges import COULOMB, atom_charges, csr_edges
from alchemi_potentials.edge_model import EdgeModel

if TYPE_CHECKING:
    from alchemi_core.data import Batch
    from alchemi_potentials.edge_model import Systems
    from alchemi_potentials.neighbors.edges import Edges


@attrs.frozen
class _Setup:
    """What a set of systems fixes: alpha per system, int32 system index, Miller indices or mesh."""

    batch: weakref.ref[Any]
    version: int
    alpha: torch.Tensor
    batch_idx: torch.Tensor
    max_atoms: int
    reciprocal: Any


class Ewald(EdgeModel):
    """Ewald summation (see the module docstring).

    Args:
        cutoff: Real-space cutoff in Å (the edges'); alpha follows from it and ``accuracy``.
        accuracy: Relative size of the neglected real- and reciprocal-space terms.
        skin: Verlet skin (Å) of the neighbour list under the edges.
        dtype: Precision (None: the positions').
        max_edges: Fixed edge capacity (None: sized from the structures).

    Raises:
        ConfigurationError: A cutoff that is not positive or an accuracy outside (0, 1).
    """

    #: Capturing ops' kernels in a CUDA graph has not been checked: the step runs eagerly.
    cuda_graphs: ClassVar[bool] = False
    #: Per-atom device bytes of a step in float32 (edges within 10 Å of a dense solid and their gradients).
    BYTES_PER_ATOM: ClassVar[float] = 4e5
    #: ``model:sum`` passes the charges an earlier part predicts as ``charges=`` (see ``SumModel``).
    takes_charges: ClassVar[bool] = True
    method: ClassVar[str] = "ewald"

    def __init__(self, cutoff: float = 10.0, accuracy: float = 1e-6, *, skin: float = 0.5,
                 dtype: torch.dtype | None = None, max_edges: int | None = None) -> None:
        if not cutoff > 0 or not 0 < accuracy < 1:
            raise ConfigurationError(
                f"model:{self.method}: need cutoff > 0 (Å) and 0 < accuracy < 1, got {cutoff!r} and {accuracy!r}"
            )
        super().__init__(cutoff=cutoff, name=self.method, dtype=dtype, skin=skin, max_edges=max_edges)
        self.cutoff, self.accuracy = float(cutoff), float(accuracy)
        self.alpha = math.sqrt(-math.log(accuracy)) / cutoff
        self.k_cutoff = 2.0 * self.alpha * math.sqrt(-math.log(accuracy))
        self._setup: _Setup | None = None
        self._given: torch.Tensor | None = None

    def forward(self, batch: Batch, compute_stress: bool = False,
                charges: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Energies ``[B, 1]``, forces ``[V, 3]`` and, when asked, stress ``[B, 3, 3]`` of the
        charges (``charges`` ``[V]`` in e, or the batch's: :func:`~alchemi_electrostatics.charges.atom_charges`).
        Forces hold the charges fixed."""
        self._given = None if charges is None else charges.detach()
        try:
            return super().forward(batch, compute_stress)
        finally:
            self._given = None

    def check_batch(self, batch: Batch) -> None:
        """Refuse systems that are not periodic in all three directions (reads back).

        Raises:
            InvalidDataError: Names the systems and the model for them.
        """
        super().check_batch(batch)
        if batch.num_graphs and ("pbc" not in batch or not bool(batch.pbc.all())):
            bad = list(range(batch.num_graphs)) if "pbc" not in batch else (
                torch.nonzero(~batch.pbc.all(dim=1)).view(-1)[:10].tolist())
            raise InvalidDataError(
                f"model:{self.method} sums over images in all three directions, and systems {bad} are not periodic "
                "in all three; use model:dsf for molecules and slabs, or give them a periodic cell"
            )

    def energies(self, batch: Systems, positions: torch.Tensor, cell: torch.Tensor, edges: Edges) -> torch.Tensor:
        q = atom_charges(batch, self._given, self.method).to(positions.dtype)  # type: ignore[arg-type]
        pairs, ptr, shifts = csr_edges(edges, batch.num_nodes)
        setup = self._setup_for(batch, cell)
        common = dict(batch_idx=setup.batch_idx, neighbor_list=pairs, neighbor_ptr=ptr, neighbor_shifts=shifts,
                      energy_reduction="system")
        return COULOMB * self._sum(positions, q, cell, setup, common).to(positions.dtype)

    def _sum(self, positions: torch.Tensor, q: torch.Tensor, cell: torch.Tensor, setup: _Setup,
             common: dict[str, Any]) -> torch.Tensor:
        from nvalchemiops.torch.interactions.electrostatics import ewald_summation

        return ewald_summation(positions, q, cell, alpha=setup.alpha, miller_indices=setup.reciprocal,
                               max_atoms_per_system=setup.max_atoms, **common)

    def _reciprocal(self, cell: torch.Tensor, alpha: torch.Tensor) -> Any:
        from nvalchemiops.torch.interactions.electrostatics import generate_ewald_miller_indices

        return generate_ewald_miller_indices(cell.detach(), self.k_cutoff)

    def _setup_for(self, batch: Systems, cell: torch.Tensor) -> _Setup:
        setup = self._setup
        version = getattr(batch, "version", -1)
        if setup is not None and setup.batch() is batch and setup.version == version \
                and setup.alpha.device == cell.device and setup.alpha.dtype == cell.dtype:
            return setup
        alpha = torch.full((batch.num_graphs,), self.alpha, dtype=cell.dtype, device=cell.device)
        sizes = batch.batch_ptr[1:] - batch.batch_ptr[:-1]
        self._setup = _Setup(weakref.ref(batch), version, alpha, batch.batch_idx.to(torch.int32), max(1, int(sizes.max())),
                             self._reciprocal(cell, alpha))
        return self._setup

    def extra_repr(self) -> str:
        return f"cutoff={self.cutoff}, accuracy={self.accuracy:g}, alpha={self.alpha:.4f}"


class PME(Ewald):
    """Particle-mesh Ewald: the reciprocal sum on an FFT mesh of B-splines of order
    ``spline_order``, O(N log N) where Ewald is O(N^1.5) at its best alpha (see the module docstring).

    Args:
        cutoff: Real-space cutoff in Å.
        accuracy: Relative size of the neglected terms; sizes the mesh too.
        spline_order: Order of the charge-assignment B-splines.
        skin: Verlet skin (Å) of the neighbour list under the edges.
        dtype: Precision (None: the positions').
        max_edges: Fixed edge capacity (None: sized from the structures).
    """

    method: ClassVar[str] = "pme"

    def __init__(self, cutoff: float = 10.0, accuracy: float = 1e-6, *, spline_order: int = 5, skin: float = 0.5,
                 dtype: torch.dtype | None = None, max_edges: int | None = None) -> None:
        super().__init__(cutoff, accuracy, skin=skin, dtype=dtype, max_edges=max_edges)
        self.spline_order = int(spline_order)

    def _sum(self, positions: torch.Tensor, q: torch.Tensor, cell: torch.Tensor, setup: _Setup,
             common: dict[str, Any]) -> torch.Tensor:
        from nvalchemiops.torch.interactions.electrostatics import particle_mesh_ewald

        return particle_mesh_ewald(positions, q, cell, alpha=setup.alpha, mesh_dimensions=setup.reciprocal,
                                   spline_order=self.spline_order, **common)

    def _reciprocal(self, cell: torch.Tensor, alpha: torch.Tensor) -> Any:
        from nvalchemiops.torch.interactions.electrostatics import estimate_pme_mesh_dimensions

        return estimate_pme_mesh_dimensions(cell.detach(), alpha, self.accuracy, spline_order=self.spline_order)
