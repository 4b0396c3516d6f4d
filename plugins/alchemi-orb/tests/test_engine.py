"""model:orb inside alchemi's engine: FIRE with a Frechet cell filter then Langevin, fused and inflight."""

from __future__ import annotations

import pytest
import torch
from alchemi_orb import OrbModel
from alchemi_orb.testing import mixed_structures

from alchemi_potentials.testing import relax_then_md


@pytest.mark.parametrize("inflight", [False, True], ids=["fused", "inflight"])
def test_fire_with_a_frechet_filter_then_langevin(conservative, inflight):
    model = OrbModel(conservative[0], atoms_adapter=conservative[1])
    periodic = [a for a in mixed_structures() if a.pbc.all()]  # the cell filter needs a volume
    start = {i: torch.tensor(a.cell.array) for i, a in enumerate(periodic)}

    def cells_moved(result):
        for i, cell in zip(result.system_id.view(-1).tolist(), result.cell.view(-1, 3, 3)):
            assert not torch.allclose(cell.double(), start[i], atol=1e-4), f"cell of system {i} did not relax"

    relax_then_md(model, periodic, torch.float32, inflight=inflight, fire_steps=6, md_steps=4,
                  cell_filter="frechet", extra_check=cells_moved)


def test_langevin_with_an_open_molecule_among_crystals(direct):
    """A direct model, and an open system in the same batch as periodic ones."""
    relax_then_md(OrbModel(direct[0], atoms_adapter=direct[1]), mixed_structures(), torch.float32, inflight=False,
                  fire_steps=3, md_steps=3)
