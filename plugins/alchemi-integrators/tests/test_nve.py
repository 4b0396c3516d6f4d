"""Velocity Verlet conserves energy and momentum and is time-reversible (LJ argon).

The cell is 2x2x2 cubic FCC argon (32 atoms, a = 5.26 Å) started from Maxwell-Boltzmann
velocities at 100 K, which equilibrate to about 55 K (half the kinetic energy goes into the
potential), with dt = 5 fs: the workload of BENCHMARKS.md at its smallest size.

Bounds, for 10,000 steps (50 ps) in float64 and float32:

* fluctuation ``max |E(t) - E(0)| < 1e-3 eV`` (3e-5 eV per atom, 0.4 % of the kinetic energy).
  Velocity Verlet's energy error is bounded (it exactly conserves a shadow Hamiltonian) with an
  amplitude of order (omega dt)^2 KE; for argon's fastest phonons (period ~ 0.5 ps) at 5 fs
  that is a few 1e-4 eV (measured 2e-4). A first-order integrator (symplectic Euler) errs by
  order omega dt KE: measured 8e-3 eV here, failing the bound.
* drift ``|slope| * 50 ps < 2e-4 eV`` (6e-6 eV per atom) from a least-squares line through E(t).
  A symplectic integrator does not drift; what remains comes from the force discontinuity at the
  cutoff (the energy is shifted to zero there, the force is not, as in ASE) and rounding, and was
  measured below 6e-5 eV in both precisions. A non-symplectic scheme (explicit Euler) gains
  energy until it blows up within these 10,000 steps.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from integrators_testkit.lj_reference import ReferenceLJ, argon
from integrators_testkit.recording import Record

from alchemi_core.data import Batch
from alchemi_integrators import VelocityVerlet
from alchemi_integrators.thermo import center_of_mass_velocity, initialize_velocities, kinetic_energy

STEPS, DT = 10_000, 5.0


def _total_energy(batch: Batch, dynamics: VelocityVerlet) -> torch.Tensor:
    total = batch.energy.view(-1).double() + kinetic_energy(batch).double()
    torch.testing.assert_close(dynamics.conserved_energy(batch).double(), total, rtol=0, atol=1e-5)
    return total


@pytest.mark.slow  # a long sampled trajectory (the oldest-Warp run leaves it out)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_energy_conserved_over_10000_steps(dtype: torch.dtype) -> None:
    batch = Batch.from_data_list([argon(2, dtype=dtype)])
    record = Record(_total_energy, frequency=10)
    nve = VelocityVerlet(ReferenceLJ(), n_steps=STEPS, dt=DT, initial_temperature=100.0, random_seed=0, hooks=[record])
    nve.run(batch)
    energy = record.array()[:, 0]
    assert len(energy) == STEPS // 10
    fluctuation = np.abs(energy - energy[0]).max()
    times = np.arange(len(energy)) * 10 * DT
    drift = abs(np.polyfit(times, energy, 1)[0]) * STEPS * DT
    assert fluctuation < 1e-3, f"energy fluctuates by {fluctuation:.2e} eV"
    assert drift < 2e-4, f"energy drifts by {drift:.2e} eV over {STEPS * DT / 1000:.0f} ps"
    # The system really moved and exchanged energy (a frozen system would pass trivially).
    assert torch.all(torch.isfinite(batch.positions))
    ke = kinetic_energy(batch).item()
    assert 0.1 < ke < 0.4


def test_momentum_conserved_and_time_reversible() -> None:
    batch = Batch.from_data_list([argon(2, rattle=0.05, seed=3)])
    initialize_velocities(batch, 80.0, seed=1)
    start_x, start_v = batch.positions.clone(), batch.velocities.clone()
    model = ReferenceLJ()
    VelocityVerlet(model, n_steps=300, dt=DT).run(batch)
    assert center_of_mass_velocity(batch).abs().max().item() < 1e-12
    assert (batch.positions - start_x).abs().max().item() > 0.05
    batch.velocities.neg_()
    VelocityVerlet(model, n_steps=300, dt=DT).run(batch)
    torch.testing.assert_close(batch.positions, start_x, rtol=0, atol=1e-9)
    torch.testing.assert_close(-batch.velocities, start_v, rtol=0, atol=1e-11)
