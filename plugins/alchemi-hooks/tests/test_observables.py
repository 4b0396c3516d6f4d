"""Kinetic energy, temperature and fmax against ASE and numpy.

ASE's unit constants (CODATA 2014) differ from alchemi's (CODATA 2018) in the seventh digit, so
comparisons allow 1e-6 relative.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

ase = pytest.importorskip("ase")
from ase import Atoms, units  # noqa: E402
from ase.constraints import FixAtoms  # noqa: E402

from alchemi_hooks.observables import degrees_of_freedom, kinetic_energy, max_force, temperature  # noqa: E402


def _ase_atoms(batch, row, frozen=None):
    lo, hi = int(batch.batch_ptr[row]), int(batch.batch_ptr[row + 1])
    atoms = Atoms(numbers=batch.atomic_numbers[lo:hi].numpy(), positions=batch.positions[lo:hi].double().numpy())
    atoms.set_masses(batch.atomic_masses[lo:hi].double().numpy())
    # ASE velocities are in Å per ASE time unit; ours in Å/fs.
    atoms.set_velocities(batch.velocities[lo:hi].double().numpy() / units.fs)
    if frozen is not None and frozen[lo:hi].any():
        atoms.set_constraint(FixAtoms(mask=frozen[lo:hi].numpy()))
    return atoms


@pytest.fixture
def moving_batch(molecules):
    batch = molecules([3, 7, 5], speed=0.02, dtype=torch.float64)
    batch.set_field("atomic_masses", torch.rand(batch.num_nodes, dtype=torch.float64) * 30 + 1, "node")
    return batch


def test_kinetic_energy_and_temperature_match_ase(moving_batch):
    ke = kinetic_energy(moving_batch)
    t = temperature(moving_batch)
    for row in range(moving_batch.num_graphs):
        atoms = _ase_atoms(moving_batch, row)
        assert float(ke[row]) == pytest.approx(atoms.get_kinetic_energy(), rel=1e-6)
        assert float(t[row]) == pytest.approx(atoms.get_temperature(), rel=1e-6)


def test_frozen_atoms_remove_three_degrees_of_freedom_each_like_fix_atoms(moving_batch):
    frozen = torch.zeros(moving_batch.num_nodes, dtype=torch.bool)
    frozen[[0, 4, 5, 11]] = True
    moving_batch.set_field("frozen", frozen, "node")
    moving_batch.velocities[frozen] = 0.0
    assert degrees_of_freedom(moving_batch).tolist() == [3 * 2, 3 * 5, 3 * 4]
    t = temperature(moving_batch)
    for row in range(moving_batch.num_graphs):
        assert float(t[row]) == pytest.approx(_ase_atoms(moving_batch, row, frozen).get_temperature(), rel=1e-6)


def test_held_components_remove_one_degree_of_freedom_each_like_fix_cartesian(moving_batch):
    """``frozen_axes`` (ASE's ``FixCartesian``) takes one degree of freedom per held component,
    on top of ``frozen`` atoms (an atom in both counts once); temperatures then match ASE's."""
    from ase.constraints import FixCartesian

    frozen = torch.zeros(moving_batch.num_nodes, dtype=torch.bool)
    frozen[[0, 4]] = True
    axes = torch.zeros(moving_batch.num_nodes, 3, dtype=torch.bool)
    axes[1] = torch.tensor([True, False, True])
    axes[4] = axes[12] = torch.tensor([False, True, False])
    moving_batch.set_field("frozen", frozen, "node")
    moving_batch.set_field("frozen_axes", axes, "node")
    moving_batch.velocities[frozen] = 0.0
    moving_batch.velocities[axes] = 0.0
    assert degrees_of_freedom(moving_batch).tolist() == [9 - 3 - 2, 21 - 3, 15 - 1]
    t = temperature(moving_batch)
    for row in range(moving_batch.num_graphs):
        lo, hi = int(moving_batch.batch_ptr[row]), int(moving_batch.batch_ptr[row + 1])
        atoms = _ase_atoms(moving_batch, row, frozen)
        rows = [i for i in range(lo, hi) if axes[i].any() and not frozen[i]]
        atoms.set_constraint(atoms.constraints + [FixCartesian([i - lo], mask=axes[i].tolist()) for i in rows])
        assert float(t[row]) == pytest.approx(atoms.get_temperature(), rel=1e-6)


def test_max_force_is_the_largest_row_norm_per_system(moving_batch):
    forces = torch.randn(moving_batch.num_nodes, 3, dtype=torch.float64)
    moving_batch.set_field("forces", forces, "node")
    got = max_force(moving_batch).numpy()
    norms = np.linalg.norm(forces.numpy(), axis=1)
    ptr = moving_batch.batch_ptr.numpy()
    assert np.allclose(got, [norms[ptr[i] : ptr[i + 1]].max() for i in range(3)], rtol=1e-12)


def test_fix_com_systems_count_three_fewer_degrees_of_freedom_like_ase_fix_com(moving_batch):
    """A system with the field ``fix_com`` (ASE's ``FixCom``) has its centre of mass at rest:
    ``3N - 3`` degrees of freedom, as ASE counts it, even when the stage leaves the COM free."""
    from ase.constraints import FixCom

    moving_batch.set_field("fix_com", torch.tensor([True, False, True]), "system")
    assert degrees_of_freedom(moving_batch).tolist() == [6, 21, 12]
    assert degrees_of_freedom(moving_batch, com_fixed=True).tolist() == [6, 18, 12]
    t = temperature(moving_batch)
    for row, held in enumerate([True, False, True]):
        atoms = _ase_atoms(moving_batch, row)
        if held:
            atoms.set_constraint(FixCom())
        assert float(t[row]) == pytest.approx(atoms.get_temperature(), rel=1e-6)
