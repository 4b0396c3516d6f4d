"""model:aimnet2 passes alchemi_core's ModelContract on periodic boxes of water (stress included).

aimnet computes in float32, so the contract's float64 comparisons take float32 bounds and its
finite differences a step of 1e-2 Å (float32 rounding of the energy over the step stays below
the tolerance; the truncation error of central differences, ~h², too).
"""

from __future__ import annotations

import pytest
import torch

from alchemi_core.data import AtomicData
from alchemi_core.testing.model_contract import ModelContract

pytestmark = pytest.mark.filterwarnings("ignore:Switching to DSF Coulomb:UserWarning")


def water_boxes(dtype: torch.dtype) -> list[AtomicData]:
    """One and two water molecules in periodic, slightly sheared boxes, rattled."""
    from ase.build import molecule

    out = []
    for n in (1, 2):
        atoms = molecule("H2O")
        atoms.center(vacuum=2.5)
        atoms = atoms.repeat((n, 1, 1))
        atoms.cell[1, 0] += 0.3
        atoms.pbc = True
        atoms.rattle(0.05, seed=n)
        atoms.info["charge"] = 0
        out.append(AtomicData.from_atoms(atoms, dtype=dtype))
    return out


class TestAIMNet2(ModelContract):
    dtypes = (torch.float32, torch.float64)
    fd_step = 1e-2
    force_rtol = 2e-3
    stress_atol = 2e-5
    same_atol = 2e-5
    fd_atoms = 2

    @pytest.fixture(autouse=True)
    def _file(self, model_path):
        self.model_path = model_path

    def make_model(self):
        from alchemi_aimnet import AIMNet2Model

        return AIMNet2Model(self.model_path)

    def structures(self, dtype: torch.dtype = torch.float64) -> list[AtomicData]:
        return water_boxes(dtype)

    def test_stress_of_a_system_without_a_cell_is_refused_naming_it(self) -> None:
        """The contract's own check, on a molecule that keeps the fields the boxes have (charge)."""
        from alchemi_core.errors import InvalidDataError

        first, *rest = self.structures(torch.float64)
        molecule = AtomicData(atomic_numbers=first.atomic_numbers, positions=first.positions,
                              atomic_masses=first.atomic_masses, charge=0, cell=torch.zeros_like(first.cell),
                              pbc=torch.zeros_like(first.pbc, dtype=torch.bool))
        batch = self.batch([*rest, molecule])
        model = self.make_model()
        with pytest.raises(InvalidDataError, match=rf"stress was asked of systems \[{len(rest)}\]"):
            model(batch, compute_stress=True)
        assert torch.isfinite(model(batch)["energy"]).all()  # energy and forces are fine
