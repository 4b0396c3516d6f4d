"""``LennardJones`` (``model:lennard-jones``): ``U(r) = 4 epsilon ((sigma/r)^12 - (sigma/r)^6)``.

Example:
    >>> from alchemi_core import registry
    >>> lj = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5125)
    >>> lj.card.cutoff, lj.card.stress
    (8.5125, True)
    >>> mix = LennardJones(epsilon={18: 0.0104, 36: 0.0141}, sigma={18: 3.405, 36: 3.65}, cutoff=9.0)
    >>> mix.card.species
    (18, 36)
    >>> fluid = LennardJones(epsilon=0.0104, sigma=3.405, cutoff=3 * 3.405, tail_correction=True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from alchemi_potentials.neighbors import BatchedNeighborList
from alchemi_potentials.pair_kernels import LENNARD_JONES
from alchemi_potentials.pair_potential import PairPotential
from alchemi_potentials.parameters import pair_table
from alchemi_potentials.tuning import PotentialsTuning


class LennardJones(PairPotential):
    """Lennard-Jones pair potential on the GPU (Warp kernels, batched periodic neighbour lists).

    Args:
        epsilon: Well depth in eV: a number, or ``{atomic number: value}`` per element.
        sigma: Zero-crossing distance in Å: a number or a per-element table.
        cutoff: Interaction range in Å (e.g. 2.5 sigma).
        shift_energy: Shift each pair energy to zero at the cutoff (as ASE's ``LennardJones``);
            the same as ``shift="energy"``.
        switch_onset: Start (Å) of a smooth switch to zero at the cutoff; None for none.
        shift: ``"none"`` (truncated: energy jumps at the cutoff), ``"energy"`` (``U(r) - U(r_c)``)
            or ``"force"`` (shifted force, ``U(r) - U(r_c) - (r - r_c) U'(r_c)``: energy and force
            go to zero at the cutoff). None (default): ``"energy"`` if ``shift_energy`` else
            ``"none"``.
        tail_correction: Add the homogeneous-fluid tail of the pairs beyond the cutoff (g(r) = 1
            there): ``E_tail = sum_ij N_i N_j/V (8/3) pi eps sigma^3 [(sigma/r_c)^9/3 - (sigma/r_c)^3]``
            to the energy and ``P_tail = sum_ij N_i N_j/V^2 (16/3) pi eps sigma^3 [2/3 (sigma/r_c)^9 -
            (sigma/r_c)^3]`` (sums over ordered species pairs) as ``-P_tail`` to the stress diagonal;
            no forces. These correct the truncated potential (``shift="none"``) to the full one, as
            the published LJ tables do; ``P_tail`` includes the mean impulsive term at the cutoff,
            so it is not ``-dE_tail/dV``. Periodic systems only.
        skin: Verlet skin in Å (default: the tuning's).
        max_neighbors: Neighbour-list columns; None sizes them from the structures.
        pair_epsilon: ``{(Z1, Z2): value}`` overriding the mixed epsilon of chosen pairs.
        pair_sigma: Likewise for sigma.
        mixing: ``"lorentz-berthelot"`` (epsilon geometric, sigma arithmetic mean) or
            ``"geometric"``.
        species: Elements that numbers-only parameters apply to (None: every element).
        neighbor_list: A shared :class:`~alchemi_potentials.neighbors.BatchedNeighborList`.
        tuning: Per-device choices (default: ``PotentialsTuning.for_device`` of the batch's device).

    Raises:
        ConfigurationError: A non-positive parameter, or an inconsistent table or cutoff option.
    """

    kind = LENNARD_JONES
    name = "lennard-jones"

    def __init__(
        self,
        epsilon: float | Mapping[Any, float],
        sigma: float | Mapping[Any, float],
        cutoff: float,
        shift_energy: bool = False,
        switch_onset: float | None = None,
        skin: float | None = None,
        max_neighbors: int | None = None,
        *,
        shift: str | None = None,
        tail_correction: bool = False,
        pair_epsilon: Mapping[tuple[Any, Any], float] | None = None,
        pair_sigma: Mapping[tuple[Any, Any], float] | None = None,
        mixing: str = "lorentz-berthelot",
        species: Sequence[Any] | None = None,
        neighbor_list: BatchedNeighborList | None = None,
        tuning: PotentialsTuning | None = None,
    ) -> None:
        table = pair_table(
            {"epsilon": epsilon, "sigma": sigma},
            kinds={"epsilon": "energy", "sigma": "length"},
            overrides={"epsilon": pair_epsilon, "sigma": pair_sigma},
            mixing=mixing,
            species=species,
            model=self.name,
        )
        super().__init__(table, cutoff=cutoff, shift_energy=shift_energy, switch_onset=switch_onset, shift=shift,
                         tail_correction=tail_correction, skin=skin, max_neighbors=max_neighbors,
                         neighbor_list=neighbor_list, tuning=tuning)

    def _coefficients(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        eps, sig = self.table.values["epsilon"], self.table.values["sigma"]
        return 4.0 * eps, sig * sig, np.zeros_like(eps)

    def _pair_energy(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, r: float) -> np.ndarray:
        s6 = (b / (r * r)) ** 3
        return a * (s6 * s6 - s6)


    def _pair_slope(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, r: float) -> np.ndarray:
        s6 = (b / (r * r)) ** 3
        return a * (6.0 * s6 - 12.0 * s6 * s6) / r

    def _tail_integrals(self) -> tuple[np.ndarray, np.ndarray]:
        eps, sig = self.table.values["epsilon"], self.table.values["sigma"]
        x3 = (sig / self.cutoff) ** 3
        scale = math.pi * eps * sig**3
        return (8.0 / 3.0) * scale * (x3**3 / 3.0 - x3), (16.0 / 3.0) * scale * (2.0 / 3.0 * x3**3 - x3)
