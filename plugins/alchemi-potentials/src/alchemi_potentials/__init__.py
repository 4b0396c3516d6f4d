"""alchemi-potentials: Lennard-Jones and Morse as Warp kernels on batched periodic neighbour
lists, edge-based models (D3, and the base of MACE and SevenNet), sums, and any ASE calculator.
Names are imported on first use.

Example:
    >>> from alchemi_potentials import LennardJones
    >>> LennardJones(epsilon=0.0104, sigma=3.405, cutoff=8.5125).card.name
    'lennard-jones'
"""

from __future__ import annotations

from alchemi_core.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "LennardJones": "alchemi_potentials.lennard_jones",
    "Morse": "alchemi_potentials.morse",
    "AseCalculatorModel": "alchemi_potentials.ase_model",
    "BatchedNeighborList": "alchemi_potentials.neighbors",
    "EdgeList": "alchemi_potentials.neighbors",
    "EdgeModel": "alchemi_potentials.edge_model",
    "D3Dispersion": "alchemi_potentials.d3",
    "SumModel": "alchemi_potentials.sum_model",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
