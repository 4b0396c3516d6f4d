"""model:ase gives exactly what the wrapped calculator gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.calculators.emt import EMT

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_potentials import AseCalculatorModel


def structures():
    cu = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2)
    cu.rattle(0.05, seed=1)
    alloy = bulk("Cu", "fcc", a=3.75, cubic=True).repeat((2, 1, 1))
    alloy.numbers[::3] = 79  # gold
    alloy.rattle(0.05, seed=2)
    alloy.set_cell(alloy.cell.array + np.array([[0, 0.2, 0], [0, 0, 0.1], [0, 0, 0]]), scale_atoms=True)
    return [cu, alloy]


@pytest.mark.parametrize("shared", [True, False], ids=["instance", "factory"])
def test_matches_the_calculator(shared):
    atoms_list = structures()
    model = registry.build("model:ase", calculator_or_factory=EMT() if shared else EMT)
    batch = Batch.from_atoms(atoms_list, dtype=torch.float64)
    out = model(batch, compute_stress=True)
    ptr = np.concatenate(([0], np.cumsum(batch.num_nodes_per_system)))
    for s, atoms in enumerate(atoms_list):
        a = atoms.copy()
        a.calc = EMT()
        assert out["energy"][s, 0].item() == pytest.approx(a.get_potential_energy(), rel=1e-12)
        np.testing.assert_allclose(out["forces"][ptr[s] : ptr[s + 1]].numpy(), a.get_forces(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(out["stress"][s].numpy(), a.get_stress(voigt=False), rtol=1e-10, atol=1e-12)
    if not shared:
        assert model.calculator(0) is not model.calculator(1)
    # float32 batches get float32 results on the batch's device
    out32 = model(Batch.from_atoms(atoms_list, dtype=torch.float32))
    assert out32["forces"].dtype == torch.float32
    torch.testing.assert_close(out32["energy"].double(), out["energy"], rtol=1e-5, atol=1e-5)


def test_stress_of_a_molecule_is_a_clear_error():
    from ase import Atoms

    molecule = Atoms("Cu2", positions=[[0, 0, 0], [2.5, 0, 0]])
    batch = Batch.from_atoms([molecule], dtype=torch.float64)
    model = AseCalculatorModel(EMT())
    assert model(batch)["forces"].shape == (2, 3)
    with pytest.raises(InvalidDataError, match=r"stress was asked of systems \[0\]"):
        model(batch, compute_stress=True)


def test_rejects_what_is_not_a_calculator():
    with pytest.raises(ConfigurationError, match="takes an ASE calculator or a callable"):
        AseCalculatorModel(42)
