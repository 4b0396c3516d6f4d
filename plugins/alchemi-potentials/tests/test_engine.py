"""The pair models inside alchemi's engine: in-place outputs and an MD trajectory equal to ASE's."""

from __future__ import annotations

import numpy as np
import torch
from ase import units
from ase.build import bulk
from ase.calculators.lj import LennardJones as AseLennardJones
from ase.md.verlet import VelocityVerlet

from alchemi_core.data import Batch
from alchemi_core.dynamics import DemoDynamics
from alchemi_potentials import LennardJones


def test_forward_writes_into_the_batch_fields(tuning):
    batch = Batch.from_atoms([bulk("Ar", "fcc", a=5.26, cubic=True).repeat(2)], dtype=torch.float64)
    batch.set_field("forces", torch.zeros_like(batch.positions), "node")
    batch.set_field("energy", torch.zeros(1, 1, dtype=torch.float64), "system")
    batch.set_field("stress", torch.zeros(1, 3, 3, dtype=torch.float64), "system")
    out = LennardJones(0.0104, 3.405, 8.5125, tuning=tuning)(batch, compute_stress=True)
    assert out["forces"] is batch.forces and out["energy"] is batch.energy and out["stress"] is batch.stress
    assert batch.energy.item() < 0


def test_velocity_verlet_trajectory_matches_ase(tuning):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(2)
    atoms.rattle(0.05, seed=4)
    # Maxwell-Boltzmann momenta at 60 K: p = sqrt(m kT) * N(0, 1) per component.
    kt = 60 * units.kB
    normal = np.random.default_rng(3).standard_normal((len(atoms), 3))
    atoms.set_momenta(normal * np.sqrt(atoms.get_masses() * kt)[:, None])
    batch = Batch.from_atoms([atoms], dtype=torch.float64)
    model = LennardJones(0.0104, 3.405, 8.5125, shift_energy=True, skin=0.3, tuning=tuning)
    steps, dt = 40, 5.0
    DemoDynamics(model=model, n_steps=steps, dt=dt).run(batch)

    reference = atoms.copy()
    reference.calc = AseLennardJones(epsilon=0.0104, sigma=3.405, rc=8.5125)
    VelocityVerlet(reference, timestep=dt * units.fs).run(steps)
    assert np.abs(reference.positions - atoms.positions).max() > 0.05  # the atoms did move
    np.testing.assert_allclose(batch.positions.numpy(), reference.positions, atol=1e-7)
    np.testing.assert_allclose(batch.forces.numpy(), reference.get_forces(), atol=1e-7)
    assert model.neighbor_list.builds(batch).item() >= 2  # the list was rebuilt on the way
