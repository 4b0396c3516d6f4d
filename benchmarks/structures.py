"""The inputs every framework gets: FCC argon cells, rattled cells and initial velocities.

Inputs are built once, on the host, in float64, and handed to each adapter, which converts them
to its own containers and dtype; so every framework starts from the same atoms, cells and
velocities. Rattled cells use one rule everywhere (the one ``w4_pipeline.py`` uses too):
``positions + 0.1 Å * randn(seed = index)``.

Example:
    >>> from benchmarks.structures import replicated_crystal
    >>> s = replicated_crystal(108, 2, temperature=50.0, seed=0)
    >>> s.num_systems, s.num_atoms, tuple(s.velocities.shape)
    (2, 216, (216, 3))
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import attrs
import numpy as np
import torch

from alchemi_core.units import ACCELERATION
from benchmarks import spec


@attrs.frozen
class Systems:
    """Many periodic argon systems, concatenated (host tensors, float64).

    Attributes:
        positions: ``[V, 3]`` Å.
        cells: ``[B, 3, 3]`` Å, one row per lattice vector.
        counts: ``[B]`` atoms per system.
        velocities: ``[V, 3]`` Å/fs, or None (at rest).
    """

    positions: torch.Tensor
    cells: torch.Tensor
    counts: torch.Tensor
    velocities: torch.Tensor | None = None

    @property
    def num_systems(self) -> int:
        return int(self.counts.numel())

    @property
    def num_atoms(self) -> int:
        return int(self.positions.shape[0])

    @property
    def numbers(self) -> torch.Tensor:
        """``[V]`` atomic numbers (all argon)."""
        return torch.full((self.num_atoms,), spec.ARGON_Z, dtype=torch.long)

    @property
    def masses(self) -> torch.Tensor:
        """``[V]`` masses in amu."""
        return torch.full((self.num_atoms,), spec.ARGON_MASS, dtype=torch.float64)

    @property
    def system_index(self) -> torch.Tensor:
        """``[V]`` the system of each atom."""
        return torch.repeat_interleave(torch.arange(self.num_systems), self.counts)

    def split(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """Per system ``(positions, cell, velocities)``."""
        sizes = self.counts.tolist()
        pos = torch.split(self.positions, sizes)
        vel = torch.split(self.velocities, sizes) if self.velocities is not None else [None] * len(sizes)
        return [(p, self.cells[i], v) for i, (p, v) in enumerate(zip(pos, vel))]

    def to_ase(self) -> list:
        """One ``ase.Atoms`` per system (velocities set when present)."""
        from ase import Atoms, units

        out = []
        for p, cell, v in self.split():
            atoms = Atoms(numbers=[spec.ARGON_Z] * len(p), positions=p.numpy(), cell=cell.numpy(), pbc=True)
            atoms.set_masses([spec.ARGON_MASS] * len(p))
            if v is not None:
                atoms.set_velocities(v.numpy() / units.fs)
            out.append(atoms)
        return out


@lru_cache(maxsize=16)
def fcc_argon(repeat: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``[4 n³, 3]`` and cell ``[3, 3]`` of the cubic FCC argon cell repeated n times.

    Atoms are ordered cell by cell (x outermost), the four basis atoms within each, as ASE's
    ``bulk("Ar", "fcc", cubic=True).repeat(n)`` orders them (the tests compare the two); numpy
    only, so the benchmarks run where ASE is not installed.
    """
    a = spec.LATTICE
    basis = a * np.array([[0.0, 0.0, 0.0], [0.0, 0.5, 0.5], [0.5, 0.0, 0.5], [0.5, 0.5, 0.0]])
    cells = a * np.array([(i, j, k) for i in range(repeat) for j in range(repeat) for k in range(repeat)], dtype=float)
    positions = (cells[:, None, :] + basis[None, :, :]).reshape(-1, 3)
    return positions, np.eye(3) * (a * repeat)


def repeat_for(atoms_per_system: int) -> int:
    """The n with ``4 n³ = atoms_per_system``.

    Raises:
        ValueError: ``atoms_per_system`` is not 4 n³ (32, 108, 256, 864, ..., 55296).
    """
    n = round((atoms_per_system / 4) ** (1 / 3))
    if 4 * n**3 != atoms_per_system:
        raise ValueError(f"FCC argon cells hold 4 n^3 atoms (32, 108, 256, 864, 55296, ...), not {atoms_per_system}")
    return n


def maxwell_boltzmann(counts: torch.Tensor, temperature: float, seed: int) -> torch.Tensor:
    """``[V, 3]`` Å/fs velocities of argon at ``temperature`` K, each system's COM at rest."""
    g = torch.Generator().manual_seed(seed)
    total = int(counts.sum())
    sigma = (spec.BOLTZMANN * temperature * ACCELERATION / spec.ARGON_MASS) ** 0.5
    v = torch.randn(total, 3, generator=g, dtype=torch.float64) * sigma
    idx = torch.repeat_interleave(torch.arange(len(counts)), counts)
    com = torch.zeros(len(counts), 3, dtype=torch.float64).index_add_(0, idx, v) / counts.unsqueeze(-1)
    return v - com[idx]


def replicated_crystal(atoms_per_system: int, systems: int, temperature: float, seed: int = 0) -> Systems:
    """W1: ``systems`` copies of the perfect crystal with Maxwell-Boltzmann velocities."""
    pos, cell = fcc_argon(repeat_for(atoms_per_system))
    counts = torch.full((systems,), atoms_per_system, dtype=torch.long)
    positions = torch.from_numpy(pos).repeat(systems, 1)
    cells = torch.from_numpy(cell).unsqueeze(0).repeat(systems, 1, 1)
    return Systems(positions, cells, counts, maxwell_boltzmann(counts, temperature, seed))


class ArgonCells:
    """Rattled FCC argon cells, made on demand: cell i repeats the cubic cell ``repeats[i]``
    times and is rattled by ``spec.RATTLE`` Å with seed i.

    Args:
        repeats: n of every cell (4 n³ atoms each).
        first_index: Index (and seed) of the first cell.

    Example:
        >>> cells = ArgonCells.drawn(5)      # W3: n from {2, 3, 4, 6}, seed 0
        >>> len(cells), cells.num_atoms(0) in (32, 108, 256, 864)
        (5, True)
    """

    def __init__(self, repeats: Sequence[int], first_index: int = 0) -> None:
        self.repeats = np.asarray(repeats, dtype=np.int64)
        self.first_index = int(first_index)

    @classmethod
    def drawn(cls, count: int, choices: Sequence[int] = spec.W3_REPEATS, seed: int = 0) -> ArgonCells:
        """``count`` cells with n drawn uniformly from ``choices`` (W3)."""
        return cls(np.random.default_rng(seed).choice(np.asarray(choices), size=count))

    def __len__(self) -> int:
        return len(self.repeats)

    def num_atoms(self, index: int) -> int:
        return 4 * int(self.repeats[index]) ** 3

    def atom_counts(self) -> np.ndarray:
        return 4 * self.repeats**3

    def cell(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions ``[N, 3]`` and cell ``[3, 3]`` (float64) of cell ``index``."""
        pos, cell = fcc_argon(int(self.repeats[index]))
        g = torch.Generator().manual_seed(self.first_index + int(index))
        noise = torch.randn(pos.shape, generator=g, dtype=torch.float64) * spec.RATTLE
        return torch.from_numpy(pos) + noise, torch.from_numpy(cell)

    def systems(self) -> Systems:
        """All cells as one :class:`Systems` (at rest)."""
        parts = [self.cell(i) for i in range(len(self))]
        return Systems(
            torch.cat([p for p, _ in parts]),
            torch.stack([c for _, c in parts]),
            torch.as_tensor(self.atom_counts(), dtype=torch.long),
        )
