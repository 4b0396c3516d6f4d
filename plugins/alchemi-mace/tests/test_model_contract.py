"""model:mace passes alchemi_core's ModelContract (a small random network, float32 and float64)."""

from __future__ import annotations

import torch

from alchemi_core.data import AtomicData
from alchemi_core.testing.model_contract import ModelContract, rattled_cells


class TestMace(ModelContract):
    dtypes = (torch.float64,)  # float32 runs in test_mace.py; one precision keeps CI short

    def make_model(self):
        from alchemi_mace import MaceModel
        from alchemi_mace.random_model import mace_mp_small_like

        net = mace_mp_small_like(seed=2, channels=8, max_ell=1, correlation=2, r_max=4.5, dtype=torch.float64)
        return MaceModel(net, dtype="float64")

    def structures(self, dtype: torch.dtype = torch.float64) -> list[AtomicData]:
        return rattled_cells((1, 2), lattice=3.61, rattle=0.05, atomic_number=29, dtype=dtype)
