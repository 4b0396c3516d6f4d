"""``Morse`` (``model:morse``): ``U(r) = D ((1 - exp(-alpha (r - r0)))^2 - 1)``.

The well has depth ``D`` at ``r0``; ``alpha`` sets its width. ASE's ``MorsePotential(epsilon,
rho0, r0, rcut1, rcut2)`` is ``Morse(D=epsilon, alpha=rho0 / r0, r0=r0, cutoff=rcut2 * r0,
switch_onset=rcut1 * r0)``.

Example:
    >>> m = Morse(D=0.35, alpha=1.2, r0=2.9, cutoff=8.0)
    >>> m.card.cutoff
    8.0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from alchemi_potentials.neighbors import BatchedNeighborList
from alchemi_potentials.pair_kernels import MORSE
from alchemi_potentials.pair_potential import PairPotential
from alchemi_potentials.parameters import pair_table
from alchemi_potentials.tuning import PotentialsTuning


class Morse(PairPotential):
    """Morse pair potential on the GPU (Warp kernels, batched periodic neighbour lists).

    Args:
        D: Well depth in eV: a number, or ``{atomic number: value}`` per element.
        alpha: Width parameter in 1/Å: a number or a per-element table.
        r0: Equilibrium distance in Å: a number or a per-element table.
        cutoff: Interaction range in Å.
        shift_energy: Shift each pair energy to zero at the cutoff.
        switch_onset: Start (Å) of a smooth switch to zero at the cutoff; None for none.
        skin: Verlet skin in Å (default: the tuning's).
        max_neighbors: Neighbour-list columns; None sizes them from the structures.
        pair_D, pair_alpha, pair_r0: ``{(Z1, Z2): value}`` overriding mixed values of chosen pairs.
        mixing: ``"lorentz-berthelot"`` (D geometric; alpha and r0 arithmetic mean) or
            ``"geometric"``.
        species: Elements that numbers-only parameters apply to (None: every element).
        neighbor_list: A shared :class:`~alchemi_potentials.neighbors.BatchedNeighborList`.
        tuning: Per-device choices (default: ``PotentialsTuning.for_device`` of the batch's device).

    Raises:
        ConfigurationError: A non-positive parameter, or an inconsistent table or cutoff option.
    """

    kind = MORSE
    name = "morse"

    def __init__(
        self,
        D: float | Mapping[Any, float],  # noqa: N803 - the symbol physicists use
        alpha: float | Mapping[Any, float],
        r0: float | Mapping[Any, float],
        cutoff: float,
        shift_energy: bool = False,
        switch_onset: float | None = None,
        skin: float | None = None,
        max_neighbors: int | None = None,
        *,
        pair_D: Mapping[tuple[Any, Any], float] | None = None,  # noqa: N803
        pair_alpha: Mapping[tuple[Any, Any], float] | None = None,
        pair_r0: Mapping[tuple[Any, Any], float] | None = None,
        mixing: str = "lorentz-berthelot",
        species: Sequence[Any] | None = None,
        neighbor_list: BatchedNeighborList | None = None,
        tuning: PotentialsTuning | None = None,
    ) -> None:
        table = pair_table(
            {"D": D, "alpha": alpha, "r0": r0},
            kinds={"D": "energy", "alpha": "inverse-length", "r0": "length"},
            overrides={"D": pair_D, "alpha": pair_alpha, "r0": pair_r0},
            mixing=mixing,
            species=species,
            model=self.name,
        )
        super().__init__(table, cutoff=cutoff, shift_energy=shift_energy, switch_onset=switch_onset, skin=skin,
                         max_neighbors=max_neighbors, neighbor_list=neighbor_list, tuning=tuning)

    def _coefficients(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        v = self.table.values
        return v["D"], v["alpha"], v["r0"]

    def _pair_energy(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, r: float) -> np.ndarray:
        x = np.exp(-b * (r - c))
        return a * x * (x - 2.0)
