"""Charged structures for tests of electrostatics models (this plugin's and others').

Example:
    >>> [len(s.positions) for s in charged_cells((1, 2))]
    [4, 32]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from alchemi_core.data import AtomicData
from alchemi_core.testing.model_contract import rattled_cells

#: Rock-salt NaCl: its Madelung constant (per nearest-neighbour distance) and lattice constant (Å).
MADELUNG, NACL_LATTICE = 1.747565, 5.64


def charged_cells(sizes: Sequence[int] = (2, 1, 2), seed: int = 0, dtype: torch.dtype = torch.float64) -> list[AtomicData]:
    """Rattled, sheared FCC cells of ``4 n^3`` atoms for each ``n`` of ``sizes``, half Na (+1 e)
    and half Cl (-1 e) at random sites: neutral, without symmetry (``initial_charges``)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in rattled_cells(sizes, lattice=NACL_LATTICE, rattle=0.2, seed=seed, dtype=dtype):
        n = len(s.positions)
        sign = torch.ones(n, dtype=dtype)
        sign[torch.randperm(n, generator=g)[: n // 2]] = -1
        out.append(AtomicData(atomic_numbers=torch.where(sign > 0, 11, 17), positions=s.positions, cell=s.cell,
                              pbc=s.pbc, initial_charges=sign))
    return out
