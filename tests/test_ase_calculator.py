"""``model.as_ase_calculator()``: ASE's answers equal a direct batched call of the model and ASE's
finite differences; ASE's own tools (BFGS, vibrations) run on it; per-atom results pass
through; without ASE the method says what to install."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import molecule
from ase.calculators.calculator import PropertyNotImplementedError
from ase.calculators.fd import calculate_numerical_forces
from ase.constraints import FixBondLength
from ase.optimize import BFGS
from ase.vibrations import Vibrations

from alchemi_core.data import Batch
from alchemi_core.errors import MissingDependencyError
from alchemi_core.models import BaseModel, ModelCard
from alchemi_core.models.demo import DemoModelWrapper


def _molecules() -> list[Atoms]:
    out = [molecule("H2O"), molecule("CH4"), molecule("C2H6")]
    for k, atoms in enumerate(out):
        atoms.rattle(0.05, seed=k)
    return out


def test_energy_and_forces_equal_a_batched_call_of_the_model():
    model = DemoModelWrapper()
    mols = _molecules()
    out = model(Batch.from_atoms(mols, dtype=torch.float64))
    start = 0
    for k, atoms in enumerate(mols):
        atoms.calc = model.as_ase_calculator()
        n = len(atoms)
        assert atoms.get_potential_energy() == pytest.approx(float(out["energy"][k, 0]), abs=1e-12)
        np.testing.assert_allclose(atoms.get_forces(), out["forces"][start:start + n].numpy(), atol=1e-12)
        np.testing.assert_allclose(atoms.get_forces(), calculate_numerical_forces(atoms, eps=1e-5), atol=1e-7)
        start += n


def test_a_model_without_stress_says_so():
    atoms = molecule("H2O", vacuum=5.0, pbc=True)
    atoms.calc = DemoModelWrapper().as_ase_calculator()
    assert "stress" not in atoms.calc.implemented_properties
    with pytest.raises(PropertyNotImplementedError):
        atoms.get_stress()


def test_ase_applies_constraints_alchemi_cannot_hold():
    atoms = molecule("H2O")
    atoms.set_constraint(FixBondLength(0, 1))
    atoms.calc = DemoModelWrapper().as_ase_calculator()
    d0 = atoms.get_distance(0, 1)
    BFGS(atoms, logfile=None).run(fmax=1e-4, steps=200)
    assert atoms.get_distance(0, 1) == pytest.approx(d0, abs=1e-8)
    assert np.abs(atoms.get_forces()).max() < 1e-4


def test_vibrations_of_a_relaxed_molecule_have_six_zero_modes(tmp_path):
    atoms = molecule("H2O")
    atoms.calc = DemoModelWrapper().as_ase_calculator()
    BFGS(atoms, logfile=None).run(fmax=1e-6, steps=500)
    vib = Vibrations(atoms, name=str(tmp_path / "vib"), delta=1e-3)
    vib.run()
    energies = np.abs(vib.get_energies())
    assert (energies < 5e-3).sum() == 6  # translations and rotations
    assert (np.real(vib.get_energies()[np.argsort(energies)[6:]]) > 0.01).all()  # a minimum: real modes


class _PerAtom(BaseModel):
    """Harmonic wells at the origin with per-atom energies and charges."""

    card = ModelCard(name="per-atom")

    def forward(self, batch, compute_stress=False):
        e = 0.5 * (batch.positions ** 2).sum(-1)
        energy = torch.zeros(batch.num_graphs, 1, dtype=e.dtype).index_add_(0, batch.batch_idx, e[:, None])
        return {"energy": energy, "forces": -batch.positions, "energies": e,
                "charges": batch.atomic_numbers.to(e.dtype) * 0.1}


def test_per_atom_energies_and_charges_pass_through():
    atoms = molecule("CH4")
    atoms.calc = _PerAtom().as_ase_calculator()
    energies = atoms.get_potential_energies()
    np.testing.assert_allclose(energies, 0.5 * (atoms.positions ** 2).sum(1), atol=1e-12)
    assert energies.sum() == pytest.approx(atoms.get_potential_energy())
    np.testing.assert_allclose(atoms.get_charges(), 0.1 * atoms.numbers)
    atoms.calc = DemoModelWrapper().as_ase_calculator()
    with pytest.raises(PropertyNotImplementedError, match="not present"):
        atoms.get_potential_energies()


def test_device_and_dtype_choices():
    calc = DemoModelWrapper().as_ase_calculator(device="cpu", dtype=torch.float32)
    assert (calc.device, calc.dtype) == (torch.device("cpu"), torch.float32)
    e32 = calc.get_potential_energy(molecule("H2O"))
    assert e32 == pytest.approx(DemoModelWrapper().as_ase_calculator().get_potential_energy(molecule("H2O")), abs=1e-5)


def test_without_ase_the_method_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ase", None)  # import ase raises ImportError
    with pytest.raises(MissingDependencyError, match=r"alchemi-core\[ase\]"):
        DemoModelWrapper().as_ase_calculator()
