"""A small, exact Lennard-Jones model for physics tests: every pair over every periodic image.

Truncated at ``cutoff`` and shifted so the pair energy is zero there (forces are not shifted):
the convention of ``ase.calculators.lj.LennardJones(smooth=False)``, so energies and forces
compare with ASE's to rounding. Computed in float64 whatever the batch's dtype; returned in the
batch's dtype. Not fast: it exists to be obviously right.

Argon (the workloads of BENCHMARKS.md): sigma 3.405 Å, epsilon 0.0104 eV, cutoff 8.5125 Å,
FCC a = 5.26 Å, mass 39.948 amu.
"""

from __future__ import annotations

import itertools
import math

import torch

from alchemi_core.data import AtomicData, Batch
from alchemi_core.models import BaseModel, ModelCard

SIGMA = 3.405
EPSILON = 0.0104
CUTOFF = 8.5125
LATTICE = 5.26
MASS = 39.948


class ReferenceLJ(BaseModel):
    """Lennard-Jones from an all-pairs, all-images search (see the module docstring).

    The search runs in float64 over every atom pair and every lattice image that can matter; its
    pairs within ``cutoff + skin`` are kept and reused until some atom has moved more than
    ``skin / 2`` (the Verlet-list guarantee: no pair outside the list can be within the cutoff),
    so each step evaluates only nearby pairs. The displacement check reads back from the device:
    fine for a test reference, not for production models.
    """

    card = ModelCard(name="reference-lj", cutoff=CUTOFF, periodic=True, stress=True)

    def __init__(
        self, sigma: float = SIGMA, epsilon: float = EPSILON, cutoff: float = CUTOFF, skin: float = 1.0
    ) -> None:
        super().__init__()
        self.sigma, self.epsilon, self.cutoff, self.skin = sigma, epsilon, cutoff, skin
        sr6 = (sigma / cutoff) ** 6
        self.shift = 4.0 * epsilon * (sr6 * sr6 - sr6)
        self._key: tuple | None = None
        self._pairs: tuple | None = None
        self._built_at: torch.Tensor | None = None
        self._built_cell: torch.Tensor | None = None
        self.rebuilds = 0

    def _search(self, batch: Batch) -> None:
        """All pairs (i, j, Cartesian image shift) within ``cutoff + skin``, by brute force."""
        pos = batch.positions.detach().double()
        reach_cut = self.cutoff + self.skin
        ii, jj, shifts, system = [], [], [], []
        start = 0
        for s, n in enumerate(batch.num_nodes_per_system.tolist()):
            cell = batch.cell[s].detach().double()
            recip = torch.linalg.inv(cell).T  # rows b_k; 1 / |b_k| is the spacing of lattice planes k
            reach = [int(math.floor(reach_cut * float(torch.linalg.norm(b)) + 0.5)) for b in recip]
            images = torch.tensor(
                list(itertools.product(*[range(-r, r + 1) for r in reach])), dtype=torch.float64, device=pos.device
            )
            frac = pos[start : start + n] @ torch.linalg.inv(cell)
            sep = frac[None, :, :] - frac[:, None, :]  # [i, j]: r_j - r_i in fractions
            wrap = -torch.round(sep)
            # [image, i, j]: which images bring j within reach of i (the home self pair excluded).
            cart_shift = (wrap[None] + images[:, None, None, :]) @ cell
            d = (sep[None] @ cell) + cart_shift
            near = (d * d).sum(-1) < reach_cut**2
            near &= ~((images == 0).all(-1)[:, None, None] & torch.eye(n, dtype=torch.bool, device=pos.device)[None])
            img, i, j = torch.nonzero(near, as_tuple=True)
            ii.append(i + start)
            jj.append(j + start)
            shifts.append((wrap[None] + images[:, None, None, :])[img, i, j])  # in cell vectors
            system.append(torch.full_like(i, s))
            start += n
        self._pairs = (torch.cat(ii), torch.cat(jj), torch.cat(shifts), torch.cat(system))
        self._built_at = pos.clone()
        self._built_cell = batch.cell.detach().double().clone()
        self.rebuilds += 1

    def _moved_too_far(self, batch: Batch, pos: torch.Tensor) -> bool:
        """Whether a pair outside the list may have come within the cutoff.

        With ``M = h^-1 h_0`` mapping the current cell back to the one of the last search, a pair
        listed beyond ``cutoff + skin`` is still beyond ``cutoff`` while every atom's ``x M`` is
        within ``(skin - cutoff |M - 1|) / 2`` of where it was then (``|.|`` the Frobenius norm,
        which bounds the stretch the deformation can give a distance)."""
        cell = batch.cell.detach().double()
        back = torch.linalg.inv(cell) @ self._built_cell
        stretch = torch.linalg.matrix_norm(back - torch.eye(3, dtype=torch.float64, device=pos.device))
        allowed = 0.5 * (self.skin - self.cutoff * stretch)
        mapped = torch.bmm(pos.unsqueeze(1), back[batch.batch_idx]).squeeze(1)
        moved = (mapped - self._built_at).norm(dim=-1)
        return bool((moved > allowed[batch.batch_idx]).any())

    def forward(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        pos = batch.positions.detach().double()
        key = (id(batch), batch.version)
        moved = (
            key != self._key
            or self._built_at is None
            or self._moved_too_far(batch, pos)
        )
        if moved:
            self._search(batch)
            self._key = key
        i, j, images, system = self._pairs
        cell = batch.cell.detach().double()
        d = pos[j] - pos[i] + torch.bmm(images.unsqueeze(1), cell[system]).squeeze(1)
        r2 = (d * d).sum(-1)
        inside = r2 < self.cutoff**2
        sr2 = torch.where(inside, self.sigma**2 / r2, 0.0)
        sr6 = sr2**3
        pair_energy = torch.where(inside, 4.0 * self.epsilon * (sr6 * sr6 - sr6) - self.shift, 0.0)
        # dphi/dr / r; the force on i from j is (dphi/dr / r) (r_j - r_i).
        dphi_over_r = torch.where(inside, 24.0 * self.epsilon * (sr6 - 2.0 * sr6 * sr6) / r2, 0.0)
        forces = torch.zeros_like(pos).index_add_(0, i, dphi_over_r.unsqueeze(-1) * d)
        energy = torch.zeros(batch.num_graphs, dtype=torch.float64, device=pos.device)
        energy.index_add_(0, system, 0.5 * pair_energy)
        dtype = batch.positions.dtype
        out = {"energy": energy.unsqueeze(-1).to(dtype), "forces": forces.to(dtype)}
        if compute_stress:
            # sigma = (1/V) dE/d(strain) = (1/V) sum over pairs of phi'(r)/r d d^T (each pair is
            # listed from both ends: half of each).
            outer = 0.5 * dphi_over_r[:, None, None] * d[:, :, None] * d[:, None, :]
            virial = torch.zeros(batch.num_graphs, 3, 3, dtype=torch.float64, device=pos.device)
            virial.index_add_(0, system, outer)
            volume = torch.linalg.det(batch.cell.detach().double()).abs().view(-1, 1, 1)
            out["stress"] = (virial / volume).to(dtype)
        return out


def argon(repeat: int = 2, rattle: float = 0.0, seed: int = 0, dtype: torch.dtype = torch.float64) -> AtomicData:
    """A cubic FCC argon cell repeated ``repeat`` times per axis (4 repeat³ atoms), optionally
    rattled by a normal displacement of ``rattle`` Å per component (seeded)."""
    from ase.build import bulk

    atoms = bulk("Ar", "fcc", a=LATTICE, cubic=True).repeat((repeat, repeat, repeat))
    if rattle:
        atoms.rattle(stdev=rattle, seed=seed)
    data = AtomicData.from_atoms(atoms, dtype=dtype)
    data.atomic_masses = torch.full((len(atoms),), MASS, dtype=dtype)
    return data


def ase_lj_calculator():  # type: ignore[no-untyped-def]
    """ASE's LJ with the same parameters and convention (energy shifted to zero at the cutoff)."""
    from ase.calculators.lj import LennardJones

    return LennardJones(sigma=SIGMA, epsilon=EPSILON, rc=CUTOFF, smooth=False)


def fast_ase_calculator():  # type: ignore[no-untyped-def]
    """The same potential as :func:`ase_lj_calculator` (to rounding), evaluated by
    :class:`ReferenceLJ`: ASE's own LJ costs ~0.5 s per call on a busy 2-core machine, which long
    ASE optimisations in tests cannot afford."""
    from ase.calculators.calculator import Calculator, all_changes

    class _ReferenceLJCalculator(Calculator):
        implemented_properties = ["energy", "free_energy", "forces", "stress"]

        def __init__(self) -> None:
            super().__init__()
            self.model = ReferenceLJ()

        def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):  # type: ignore[no-untyped-def]
            super().calculate(atoms, properties, system_changes)
            data = AtomicData.from_atoms(self.atoms, dtype=torch.float64)
            from alchemi_core.data import Batch

            out = self.model(Batch.from_data_list([data]), compute_stress=True)
            stress = out["stress"][0].numpy()
            self.results = {
                "energy": float(out["energy"][0, 0]),
                "free_energy": float(out["energy"][0, 0]),
                "forces": out["forces"].numpy().copy(),
                "stress": stress[[0, 1, 2, 1, 0, 0], [0, 1, 2, 2, 2, 1]].copy(),
            }

    return _ReferenceLJCalculator()
