"""``ModelContract`` for Ewald, PME and DSF on random neutral boxes of +-1 charges (float64)."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.data import AtomicData
from alchemi_core.errors import InvalidDataError
from alchemi_core.testing.model_contract import ModelContract
from alchemi_electrostatics import DSF, PME, Ewald
from alchemi_electrostatics.testing import charged_cells


class ChargedContract(ModelContract):
    dtypes = (torch.float64,)
    stress_atol = 1e-7

    def structures(self, dtype=torch.float64):
        return charged_cells((2, 1), dtype=dtype)


class TestEwald(ChargedContract):
    def make_model(self):
        return Ewald(cutoff=8.0, accuracy=1e-8)

    def test_stress_of_a_system_without_a_cell_is_refused_naming_it(self):
        first, *_ = self.structures()
        molecule = AtomicData(atomic_numbers=first.atomic_numbers, positions=first.positions,
                              initial_charges=first.initial_charges)
        with pytest.raises(InvalidDataError, match=r"systems \[0\] are not periodic.*model:dsf"):
            self.make_model()(self.batch([molecule]), compute_stress=True)


class TestPME(TestEwald):
    # The mesh breaks translation invariance at the level of the accuracy asked, and a batch's
    # systems share one mesh (ops' contract), finer for a small cell than its own would be.
    same_atol = 1e-7

    def make_model(self):
        return PME(cutoff=8.0, accuracy=1e-8)


class TestDSF(ChargedContract):
    stress_atol = 1e-6  # ops' virial against the strain derivative: 3e-6 relative
    def make_model(self):
        return DSF(alpha=0.2, cutoff=9.0)

    def test_stress_of_a_system_without_a_cell_is_refused_naming_it(self):
        crystal, small = self.structures()
        molecule = AtomicData(atomic_numbers=crystal.atomic_numbers, positions=crystal.positions,
                              cell=torch.zeros(3, 3, dtype=torch.float64), pbc=[False] * 3,
                              initial_charges=crystal.initial_charges)
        batch, model = self.batch([small, molecule]), self.make_model()
        with pytest.raises(InvalidDataError, match=r"stress was asked of systems \[1\]"):
            model(batch, compute_stress=True)
        assert torch.isfinite(model(batch)["energy"]).all()  # molecules are DSF's to compute
