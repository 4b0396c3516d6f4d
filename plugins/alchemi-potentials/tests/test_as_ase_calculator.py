"""``model.as_ase_calculator()`` with Lennard-Jones: ASE's answers equal a direct batched call of
the model and ASE's finite differences, and ASE's optimisers (with a cell filter) run on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.calculators.calculator import PropertyNotImplementedError
from ase.calculators.fd import calculate_numerical_forces, calculate_numerical_stress
from ase.filters import FrechetCellFilter
from ase.optimize import BFGS
from ase.stress import full_3x3_to_voigt_6_stress

from alchemi_core.data import Batch
from alchemi_potentials import LennardJones


def _lj() -> LennardJones:
    return LennardJones(epsilon=0.0104, sigma=3.405, cutoff=8.5)


def _argon(scale: float, seed: int, repeat: tuple[int, int, int] = (2, 2, 2)):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True) * repeat
    atoms.set_cell(atoms.cell * scale, scale_atoms=True)
    atoms.rattle(0.05, seed=seed)
    return atoms


def test_energy_forces_and_stress_equal_a_batched_call_of_the_model():
    crystals = [_argon(1.02, 1), _argon(0.98, 2, (2, 2, 1)), _argon(1.05, 3, (1, 2, 2))]
    model = _lj()
    out = model(Batch.from_atoms(crystals, dtype=torch.float64), compute_stress=True)
    start = 0
    for k, atoms in enumerate(crystals):
        atoms.calc = model.as_ase_calculator()
        n = len(atoms)
        assert atoms.get_potential_energy() == pytest.approx(float(out["energy"][k, 0]), abs=1e-12)
        assert atoms.get_potential_energy(force_consistent=True) == atoms.get_potential_energy()
        np.testing.assert_allclose(atoms.get_forces(), out["forces"][start:start + n].numpy(), atol=1e-12)
        np.testing.assert_allclose(atoms.get_stress(), full_3x3_to_voigt_6_stress(out["stress"][k].numpy()),
                                   atol=1e-12)
        start += n


def test_stress_and_forces_equal_ases_finite_differences():
    atoms = _argon(1.01, 4)
    atoms.set_cell(atoms.cell @ np.array([[1.0, 0.02, 0.0], [0.0, 1.0, -0.01], [0.0, 0.0, 0.99]]), scale_atoms=True)
    atoms.calc = _lj().as_ase_calculator()
    np.testing.assert_allclose(atoms.get_stress(), calculate_numerical_stress(atoms, eps=1e-6), atol=1e-8)
    assert np.abs(atoms.get_stress()).max() > 1e-4  # a stress worth comparing
    np.testing.assert_allclose(atoms.get_forces(), calculate_numerical_forces(atoms, eps=1e-5), atol=1e-7)


def test_float32_follows_float64():
    atoms = _argon(1.0, 5)
    e64 = _lj().as_ase_calculator().get_potential_energy(atoms)
    calc32 = _lj().as_ase_calculator(dtype=torch.float32)
    assert calc32.dtype == torch.float32
    assert calc32.get_potential_energy(atoms) == pytest.approx(e64, abs=1e-4)


def test_bfgs_relaxes_positions_and_cell_through_ases_filter():
    atoms = _argon(1.04, 6)
    atoms.calc = _lj().as_ase_calculator()
    e0 = atoms.get_potential_energy()
    relaxing = FrechetCellFilter(atoms)
    BFGS(relaxing, logfile=None).run(fmax=1e-3, steps=300)
    assert np.abs(relaxing.get_forces()).max() < 1e-3  # the atoms' forces and the cell's
    assert atoms.get_potential_energy() < e0
    assert atoms.get_volume() < _argon(1.04, 6).get_volume()  # the stretched cell shrank


def test_stress_of_atoms_that_are_not_periodic_is_not_implemented():
    atoms = _argon(1.0, 7)
    atoms.pbc = [True, True, False]
    atoms.calc = _lj().as_ase_calculator()
    assert atoms.get_forces().shape == (len(atoms), 3)
    with pytest.raises(PropertyNotImplementedError, match="periodic in x, y and z"):
        atoms.get_stress()
