"""``DemoModelWrapper``: a small deterministic model with exact forces, for tests and examples.

Every pair of atoms in a system interacts through a Morse potential

    phi(r) = D * ((1 - exp(-a (r - r0)))**2 - 1),   r0 = 0.5 + 0.1 * (sqrt(Z_i) + sqrt(Z_j)) Å

with D = 0.2 eV and a = 1.5 / Å by default: finite at every distance, one minimum per pair, and
analytic forces (so energy is conserved to integrator accuracy). No cutoff and no periodicity:
it suits the small molecules of the seed examples, not bulk crystals (use ``model:lennard-jones``).

Example:
    >>> import torch
    >>> from alchemi_core.data import AtomicData, Batch
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> batch = Batch.from_data_list([AtomicData(atomic_numbers=torch.tensor([6, 8]),
    ...                                          positions=torch.tensor([[0., 0, 0], [1.3, 0, 0]]))])
    >>> out = DemoModelWrapper()(batch)
    >>> out["energy"].shape, out["forces"].shape
    (torch.Size([1, 1]), torch.Size([2, 3]))
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from alchemi_core.models.base import BaseModel, ModelCard

if TYPE_CHECKING:
    from alchemi_core.data import Batch


def _ordered_pairs(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every ordered pair ``(i, j)``, ``i != j``, of atoms within each system, and its system, for
    systems of ``counts`` atoms laid out one after another; by system, then ``i``, then ``j``.

    Built without a loop over systems (a refill of a 64-system batch rebuilds it).

    Example:
        >>> [a.tolist() for a in _ordered_pairs(np.array([2, 1, 3]))]
        [[0, 1, 3, 3, 4, 4, 5, 5], [1, 0, 4, 5, 3, 5, 3, 4], [0, 0, 2, 2, 2, 2, 2, 2]]
    """
    starts = np.cumsum(counts) - counts
    atom_system = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    per_atom = counts[atom_system]  # each atom pairs with every atom of its system
    i = np.repeat(np.arange(len(per_atom), dtype=np.int64), per_atom)  # one block of rows per atom
    first_row = (np.cumsum(per_atom) - per_atom)[i]
    system = atom_system[i]
    j = starts[system] + (np.arange(len(i), dtype=np.int64) - first_row)
    keep = i != j
    return i[keep], j[keep], system[keep]


class DemoModelWrapper(BaseModel):
    """All-pairs Morse model (see the module docstring).

    Args:
        depth: Well depth D in eV.
        stiffness: Width parameter a in 1/Å.
    """

    card = ModelCard(name="demo", cutoff=None, periodic=False, stress=False)

    def __init__(self, depth: float = 0.2, stiffness: float = 1.5) -> None:
        super().__init__()
        self.depth = float(depth)
        self.stiffness = float(stiffness)
        self._cache_key: tuple[weakref.ref[Batch], int, torch.device, torch.dtype] | None = None
        self._pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The pair table is a cache keyed on a weak reference, which pickle cannot take.
        return {**super().__getstate__(), "_cache_key": None, "_pairs": None}

    def _pair_table(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Ordered pairs (i, j), each pair's system and ``a * r0``; rebuilt when systems change."""
        pos = batch.positions
        # A weak reference, not id(): a new batch can take a freed one's id (and version).
        key = (weakref.ref(batch), batch.version, pos.device, pos.dtype)
        if key != self._cache_key or self._pairs is None:
            i_np, j_np, s_np = _ordered_pairs(np.asarray(batch.num_nodes_per_system, dtype=np.int64))
            dev = pos.device
            i_t = torch.from_numpy(i_np).to(dev)
            j_t = torch.from_numpy(j_np).to(dev)
            s_t = torch.from_numpy(s_np).to(dev)
            root = batch.atomic_numbers.to(pos.dtype).sqrt()
            r0 = 0.5 + 0.1 * (root[i_t] + root[j_t])
            self._pairs = (i_t, j_t, s_t, self.stiffness * r0)
            self._cache_key = key
        return self._pairs

    def forward(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        if compute_stress:
            from alchemi_core.errors import ConfigurationError

            raise ConfigurationError("DemoModelWrapper is not periodic and gives no stress")
        i, j, sys, a_r0 = self._pair_table(batch)
        pos = batch.positions
        d = pos.index_select(0, i) - pos.index_select(0, j)
        r = torch.linalg.vector_norm(d, dim=-1).clamp_min_(1e-6)
        x = torch.exp(torch.sub(a_r0, r, alpha=self.stiffness))  # exp(-a (r - r0))
        energy, forces = self._outputs(batch)
        # Each unordered pair appears twice: half of phi = D x (x - 2) per ordered pair.
        # (Constants ride on alpha/value arguments: each spelled-out scalar would cost an op.)
        energy.index_add_(0, sys, x.square().sub_(x, alpha=2.0).unsqueeze(-1), alpha=0.5 * self.depth)
        # F_i = -dphi/dr * d / r with dphi/dr = 2 D a x (1 - x).
        coef = torch.addcmul(x, x, x, value=-1.0).div_(r)
        forces.index_add_(0, i, d * coef.unsqueeze(-1), alpha=-2.0 * self.depth * self.stiffness)
        return {"energy": energy, "forces": forces}

    @staticmethod
    def _outputs(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed result tensors: the batch's own ``energy``/``forces`` when they fit (so the
        engine need not copy), fresh ones otherwise."""
        pos = batch.positions
        energy, forces = batch.get("energy"), batch.get("forces")
        if (
            energy is None or forces is None or torch.is_grad_enabled() and pos.requires_grad
            or energy.shape != (batch.num_graphs, 1) or energy.dtype != pos.dtype
            or forces.shape != pos.shape or forces.dtype != pos.dtype
        ):
            return (torch.zeros(batch.num_graphs, 1, dtype=pos.dtype, device=pos.device), torch.zeros_like(pos))
        return energy.zero_(), forces.zero_()
