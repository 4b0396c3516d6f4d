"""``DSF`` (``model:dsf``): damped shifted force Coulomb (Fennell and Gezelter, 2006) of per-atom
charges, from nvalchemi-toolkit-ops, on alchemi's edges within ``cutoff``.

A pair sum ``q_i q_j [erfc(alpha r)/r - erfc(alpha rc)/rc + (r - rc) (erfc(alpha rc)/rc^2 +
2 alpha/sqrt(pi) exp(-alpha^2 rc^2)/rc)]`` and a self term, so energy and force go smoothly to
zero at the cutoff: O(N), for molecules, slabs and crystals alike. It approximates the Ewald
energy; how well depends on ``alpha`` and ``cutoff`` (rock-salt NaCl: 3e-5 relative at
``alpha = 0.3``, ``cutoff = 10``; see the tests and docs/models.md). Forces and the virial come
from ops' kernel directly (its energy is not differentiable in the positions), stress as
``-virial / volume``; a system without a cell gets NaN stress.

Example:
    >>> from ase.build import bulk
    >>> from alchemi_core.data import Batch
    >>> nacl = bulk("NaCl", "rocksalt", a=5.64, cubic=True)
    >>> nacl.set_initial_charges([1, -1] * 4)
    >>> out = DSF(alpha=0.3, cutoff=10.0)(Batch.from_atoms([nacl]))
    >>> round(float(out["energy"]) / 4, 2)
    -8.92
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from alchemi_core.errors import ConfigurationError
from alchemi_core.models.base import BaseModel, ModelCard
from alchemi_electrostatics.charges import COULOMB, atom_charges, csr_edges
from alchemi_potentials.edge_model import cell_volumes
from alchemi_potentials.neighbors import EdgeList

if TYPE_CHECKING:
    from alchemi_core.data import Batch


class DSF(BaseModel):
    """Damped shifted force Coulomb (see the module docstring).

    Args:
        alpha: Damping parameter in 1/Å (0: shifted-force bare Coulomb).
        cutoff: Cutoff in Å.
        skin: Verlet skin (Å) of the neighbour list under the edges.
        max_edges: Fixed edge capacity (None: sized from the structures).

    Raises:
        ConfigurationError: A cutoff that is not positive or a negative alpha.
    """

    takes_charges: ClassVar[bool] = True
    #: Capturing ops' kernel in a CUDA graph has not been checked: the step runs eagerly.
    cuda_graphs: ClassVar[bool] = False

    def __init__(self, alpha: float = 0.2, cutoff: float = 12.0, *, skin: float = 0.5,
                 max_edges: int | None = None) -> None:
        super().__init__()
        if not cutoff > 0 or not alpha >= 0:
            raise ConfigurationError(f"model:dsf: need cutoff > 0 (Å) and alpha >= 0 (1/Å), got {cutoff!r} and {alpha!r}")
        self.alpha, self.cutoff = float(alpha), float(cutoff)
        self.edge_list = EdgeList(cutoff, skin, None, max_edges)
        self.card = ModelCard(name="dsf", cutoff=self.cutoff, periodic=True, stress=True)

    def forward(self, batch: Batch, compute_stress: bool = False,
                charges: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Energies ``[B, 1]``, forces ``[V, 3]`` and, when asked, stress ``[B, 3, 3]`` of the
        charges (``charges`` ``[V]`` in e, or the batch's). Forces hold the charges fixed."""
        from nvalchemiops.torch.interactions.electrostatics import dsf_coulomb

        pos = batch.positions.detach()
        q = atom_charges(batch, None if charges is None else charges.detach(), "dsf").to(pos.dtype)
        edges = self.edge_list.update(batch)
        pairs, ptr, shifts = csr_edges(edges, batch.num_nodes)
        cell = batch.cell.detach().to(pos.dtype) if "cell" in batch else torch.zeros(
            (batch.num_graphs, 3, 3), dtype=pos.dtype, device=pos.device)
        out = dsf_coulomb(pos, q, self.cutoff, self.alpha, cell=cell, batch_idx=batch.batch_idx.to(torch.int32),
                          neighbor_list=pairs, neighbor_ptr=ptr, unit_shifts=shifts, compute_forces=True,
                          compute_virial=compute_stress, num_systems=batch.num_graphs)
        result = {"energy": (COULOMB * out[0]).to(pos.dtype).reshape(-1, 1), "forces": COULOMB * out[1]}
        if compute_stress:
            result["stress"] = -COULOMB * out[2] / cell_volumes(cell).view(-1, 1, 1)
        return result

    def verify(self, batch: Batch) -> None:
        """Raise what the edge list recorded on the device (capacity, cells)."""
        self.edge_list.verify(batch)

    def error_flag(self, batch: Batch) -> torch.Tensor | None:
        """True on the device when :meth:`verify` may raise."""
        return self.edge_list.error_flag(batch)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, cutoff={self.cutoff}"
