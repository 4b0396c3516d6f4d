"""Every model of this package passes alchemi_core's ModelContract."""

from __future__ import annotations

import pytest
import torch

from alchemi_core import registry
from alchemi_core.data import AtomicData
from alchemi_core.testing.model_contract import ModelContract, rattled_cells


class TestLennardJones(ModelContract):
    def make_model(self):
        return registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5125)


class TestLennardJonesShiftedForce(ModelContract):
    def make_model(self):
        return registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5125, shift="force")


class TestMorse(ModelContract):
    def make_model(self):
        return registry.build("model:morse", D=0.01, alpha=1.2, r0=3.8, cutoff=7.0)


class TestAseCalculator(ModelContract):
    """EMT copper through model:ase (float64 only: the calculator computes in float64)."""

    dtypes = (torch.float64,)

    def make_model(self):
        from ase.calculators.emt import EMT

        pytest.importorskip("ase")
        return registry.build("model:ase", calculator_or_factory=EMT)

    def structures(self, dtype: torch.dtype = torch.float64) -> list[AtomicData]:
        return rattled_cells((1, 2), lattice=3.61, rattle=0.05, atomic_number=29, dtype=dtype)


class TestD3(ModelContract):
    """DFT-D3(BJ) with short cutoffs (small edge lists on a CPU), float64 (test_d3.py runs it
    against the D3 program)."""

    dtypes = (torch.float64,)

    def make_model(self):
        pytest.importorskip("torch_dftd")
        return registry.build("model:d3", functional="pbe", cutoff=9.0, cn_cutoff=7.0)

    def structures(self, dtype: torch.dtype = torch.float64) -> list[AtomicData]:
        return rattled_cells((1, 2), lattice=3.61, rattle=0.05, atomic_number=29, dtype=dtype)
