"""model:orb passes alchemi_core's ModelContract (a small random orb-v3 conservative network, float64)."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.data import AtomicData
from alchemi_core.testing.model_contract import ModelContract, rattled_cells


class TestOrb(ModelContract):
    dtypes = (torch.float64,)  # float32 runs in test_orb.py; finite differences need float64
    fd_atoms = 2  # each displacement is a forward of the batch: keeps CI short

    @pytest.fixture(autouse=True)
    def _network(self, conservative64):
        self.network, self.adapter = conservative64

    def make_model(self):
        from alchemi_orb import OrbModel

        return OrbModel(self.network, atoms_adapter=self.adapter, dtype="float64")

    def structures(self, dtype: torch.dtype = torch.float64) -> list[AtomicData]:
        # Cu within 6 Å: 78 neighbours, under ORB's 120, so the graph has no nearest-neighbour cut
        return rattled_cells((1, 2), lattice=3.61, rattle=0.05, atomic_number=29, dtype=dtype)
