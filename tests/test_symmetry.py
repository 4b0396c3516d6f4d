"""FixSymmetry and FixCom in the core: forces, stress and steps averaged over the space group as
ASE's ``FixSymmetry`` averages them, the centre of mass held as ASE's ``FixCom`` holds it, and
both read from and written to ASE atoms losslessly."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

pytest.importorskip("ase")
pytest.importorskip("spglib")

from ase.build import bulk  # noqa: E402
from ase.constraints import FixAtoms, FixCom, FixSubsetCom, FixSymmetry  # noqa: E402

from alchemi_core.data import AtomicData, Batch  # noqa: E402
from alchemi_core.dynamics import DemoDynamics  # noqa: E402
from alchemi_core.dynamics.constraints import CentreOfMass  # noqa: E402
from alchemi_core.dynamics.symmetry import Symmetry, find_symmetry, require_symmetry  # noqa: E402
from alchemi_core.errors import InvalidDataError, MissingDependencyError  # noqa: E402
from alchemi_core.models.demo import DemoModelWrapper  # noqa: E402


def layered(strain: tuple[float, float, float] = (1.03, 1.03, 0.98)):  # type: ignore[no-untyped-def]
    """Cubic fcc Cu, 2x2x2, a layer moved along z and the cell strained tetragonally: P4mm (99),
    a group whose atoms have free coordinates, so averaged forces are not zero."""
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
    layer = atoms.get_scaled_positions()[:, 2] < 0.2
    atoms.positions[layer, 2] += 0.15
    atoms.set_cell(atoms.cell.array @ np.diag(strain), scale_atoms=True)
    return atoms


def symmetric_batch(atoms) -> tuple[Batch, Symmetry]:  # type: ignore[no-untyped-def]
    batch = Batch.from_atoms([atoms], dtype=torch.float64)
    sym = Symmetry()
    sym.write(batch)
    return batch, sym


def test_find_symmetry_gives_spglib_group_and_a_permutation_per_operation() -> None:
    atoms = layered()
    ops = find_symmetry(atoms.numbers, atoms.positions, atoms.cell.array, symprec=0.01)
    assert ops.number == 99
    assert ops.rotations.shape == (ops.images.shape[0], 3, 3) and ops.images.shape[1] == len(atoms)
    for images in ops.images:  # each operation permutes the atoms
        assert sorted(images.tolist()) == list(range(len(atoms)))
    for r in ops.rotations:  # Cartesian rotations of a (here orthogonal) cell are orthogonal
        np.testing.assert_allclose(r @ r.T, np.eye(3), atol=1e-12)
    # One operation per distinct rotation; the 8 lattice translations the layered supercell keeps
    # (those in its xy plane) make orbits of 8 atoms, each labelled by its first atom.
    assert len(ops.rotations) == 8
    assert sorted(np.bincount(ops.orbits)[np.unique(ops.orbits)].tolist()) == [8, 8, 8, 8]
    assert all(ops.orbits[i] <= i for i in range(len(atoms)))


def test_forces_and_stress_are_averaged_as_ase_fixsymmetry_averages_them() -> None:
    atoms = layered()
    atoms.set_constraint(FixSymmetry(atoms, symprec=0.01))  # refines atoms, as the engine does
    batch, sym = symmetric_batch(atoms)
    rng = np.random.default_rng(1)
    forces, stress = rng.normal(size=(len(atoms), 3)), rng.normal(size=(3, 3))
    stress = stress + stress.T
    batch.forces = torch.from_numpy(forces.copy())
    batch.set_field("stress", torch.from_numpy(stress.copy()).unsqueeze(0), "system")
    sym.forces(batch)
    want_f, want_s = forces.copy(), np.zeros(6)
    from ase.stress import full_3x3_to_voigt_6_stress, voigt_6_to_full_3x3_stress

    want_s = full_3x3_to_voigt_6_stress(stress)
    atoms.constraints[0].adjust_forces(atoms, want_f)
    atoms.constraints[0].adjust_stress(atoms, want_s)
    assert np.abs(want_f - forces).max() > 0.1, "the forces change"
    np.testing.assert_allclose(batch.forces.numpy(), want_f, rtol=0, atol=1e-12)
    np.testing.assert_allclose(batch.stress[0].numpy(), voigt_6_to_full_3x3_stress(want_s), rtol=0, atol=1e-12)


def test_cell_and_position_steps_are_averaged_as_ase_adjusts_them() -> None:
    atoms = layered()
    atoms.set_constraint(FixSymmetry(atoms, symprec=0.01))
    batch, sym = symmetric_batch(atoms)
    rng = np.random.default_rng(2)
    new_cell = atoms.cell.array @ (np.eye(3) + 0.01 * rng.normal(size=(3, 3)))
    carry = torch.from_numpy(np.linalg.solve(atoms.cell.array, new_cell)).unsqueeze(0)
    old = batch.cell.clone()
    sym.cell_step(batch, old, carry)
    want_cell = new_cell.copy()
    atoms.constraints[0].adjust_cell(atoms, want_cell)
    np.testing.assert_allclose(batch.cell[0].numpy(), want_cell, rtol=0, atol=1e-12)
    start = batch.positions.clone()
    new = atoms.positions + 0.05 * rng.normal(size=(len(atoms), 3))
    batch.positions.copy_(torch.from_numpy(new))
    sym.position_step(batch, start)
    want = new.copy()
    atoms.constraints[0].adjust_positions(atoms, want)
    np.testing.assert_allclose(batch.positions.numpy(), want, rtol=0, atol=1e-12)


def test_systems_without_symprec_keep_their_forces_bit_for_bit() -> None:
    plain = bulk("Cu", "fcc", a=3.6, cubic=True)
    plain.positions += np.random.default_rng(3).normal(size=plain.positions.shape) * 0.1
    sym_atoms = layered()
    sym_atoms.set_constraint(FixSymmetry(sym_atoms, symprec=0.01))
    batch = Batch.from_atoms([plain, sym_atoms], dtype=torch.float64)
    assert batch.symprec.tolist() == [0.0, 0.01]
    sym = Symmetry()
    sym.write(batch)
    forces = torch.randn(batch.num_nodes, 3, dtype=torch.float64)
    batch.forces = forces.clone()
    sym.forces(batch)
    assert torch.equal(batch.forces[:4], forces[:4])
    assert not torch.allclose(batch.forces[4:], forces[4:])


def test_the_engine_refines_a_structure_to_its_group_when_it_enters() -> None:
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.positions += np.random.default_rng(4).normal(size=atoms.positions.shape) * 1e-3
    want = atoms.copy()
    FixSymmetry(want, symprec=0.01)  # refines ``want`` in place
    data = AtomicData.from_atoms(atoms, dtype=torch.float64)
    data.symprec = torch.tensor([0.01], dtype=torch.float64)
    batch = Batch.from_data_list([data])
    Symmetry().write(batch)
    np.testing.assert_allclose(batch.positions.numpy(), want.positions, rtol=0, atol=1e-12)
    np.testing.assert_allclose(batch.cell[0].numpy(), want.cell.array, rtol=0, atol=1e-12)


def test_fix_com_forces_equal_ases_and_dynamics_keep_the_centre_of_mass() -> None:
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
    atoms.positions += np.random.default_rng(5).normal(size=atoms.positions.shape) * 0.1
    atoms.set_masses(np.random.default_rng(6).uniform(10, 60, len(atoms)))
    atoms.set_velocities(np.random.default_rng(7).normal(size=(len(atoms), 3)) * 0.01)
    atoms.set_constraint(FixCom())
    batch = Batch.from_atoms([atoms], dtype=torch.float64)
    assert batch.fix_com.tolist() == [True]
    com = CentreOfMass()
    com.write(batch)
    forces = np.random.default_rng(8).normal(size=(len(atoms), 3))
    batch.forces = torch.from_numpy(forces.copy())
    com.forces(batch)
    FixCom().adjust_forces(atoms, forces)
    np.testing.assert_allclose(batch.forces.numpy(), forces, rtol=0, atol=1e-13)

    m = batch.atomic_masses.view(-1, 1)
    start = (m * batch.positions).sum(0) / m.sum()
    assert (m * batch.velocities).sum(0).abs().max() > 1e-3, "the start drifts"
    out = DemoDynamics(model=DemoModelWrapper(), n_steps=20, dt=0.5).run(batch)
    assert out is not None
    torch.testing.assert_close((m * out.positions).sum(0) / m.sum(), start, rtol=0, atol=1e-10)
    torch.testing.assert_close((m * out.velocities).sum(0), torch.zeros(3, dtype=torch.float64), rtol=0, atol=1e-12)


def test_ase_round_trip_keeps_fixsymmetry_and_fixcom() -> None:
    atoms = layered()
    atoms.set_constraint([FixSymmetry(atoms, symprec=0.02), FixCom(), FixAtoms([3])])
    before = atoms.copy()
    batch = Batch.from_atoms([atoms, bulk("Cu", "fcc", a=3.6, cubic=True)], dtype=torch.float64)
    assert batch.symprec.tolist() == [0.02, 0.0] and batch.fix_com.tolist() == [True, False]
    back, plain = batch.to_atoms()
    kinds = [type(c) for c in back.constraints]
    assert kinds == [FixAtoms, FixSymmetry, FixCom]
    assert back.constraints[1].symprec == 0.02
    assert len(back.constraints[1].rotations) == len(atoms.constraints[0].rotations)
    np.testing.assert_array_equal(back.positions, before.positions)  # bit for bit: nothing refined again
    np.testing.assert_array_equal(back.cell.array, before.cell.array)
    assert plain.constraints == []


@pytest.mark.parametrize(
    "constraint",
    [lambda a: FixSymmetry(a.copy(), adjust_cell=False), lambda a: FixSubsetCom([0, 1])],
    ids=["FixSymmetry-without-cell", "FixSubsetCom"],
)
def test_constraints_alchemi_cannot_honour_are_refused(constraint) -> None:  # type: ignore[no-untyped-def]
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.set_constraint(constraint(atoms))
    with pytest.raises(InvalidDataError, match="cannot honour"):
        AtomicData.from_atoms(atoms)


def test_without_spglib_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "spglib", None)
    with pytest.raises(MissingDependencyError, match=r"alchemi-core\[symmetry\]"):
        require_symmetry()
