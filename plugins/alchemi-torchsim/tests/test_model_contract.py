"""model:torchsim passes alchemi_core's ModelContract: TorchSim's Lennard-Jones (float32 and
float64 positions on a float64 model) and MACE's TorchSim wrapper."""

from __future__ import annotations

import torch

from alchemi_core.data import AtomicData
from alchemi_core.testing.model_contract import ModelContract, rattled_cells
from alchemi_torchsim import TorchSimModel
from alchemi_torchsim.testing import lennard_jones, mace_torchsim


class TestTorchSimLennardJones(ModelContract):
    fd_atoms = 2  # TorchSim's neighbour list is the slow part on a CPU

    def make_model(self):
        return TorchSimModel(lennard_jones())


class TestTorchSimMace(ModelContract):
    dtypes = (torch.float64,)
    fd_atoms = 2

    def make_model(self):
        return TorchSimModel(mace_torchsim(), species=range(1, 31))

    def structures(self, dtype: torch.dtype = torch.float64) -> list[AtomicData]:
        return rattled_cells((1, 2), lattice=3.61, rattle=0.05, atomic_number=29, dtype=dtype)
