"""BAOAB Langevin samples the canonical ensemble (LJ argon) and its O step is exact (free atoms)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from integrators_testkit.lj_reference import ReferenceLJ, argon
from integrators_testkit.oracles import implementation
from integrators_testkit.recording import Record, integrated_autocorrelation_time
from integrators_testkit.resume import resumed_run

from alchemi_core.data import AtomicData, Batch
from alchemi_core.units import KB
from alchemi_integrators import Langevin, VelocityVerlet
from alchemi_integrators.thermo import (
    center_of_mass_velocity,
    degrees_of_freedom,
    initialize_velocities,
    kinetic_energy,
)

#: Production (Warp) and its torch oracle (integrators_testkit/oracles.py).
BACKENDS = ["torch", "warp"]


class FreeAtoms:
    """A model with zero forces: Langevin then is an Ornstein-Uhlenbeck process per component."""

    def __call__(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        return {"energy": batch.energy.zero_(), "forces": batch.forces.zero_()}


@pytest.mark.slow  # a long sampled trajectory (the oldest-Warp run leaves it out)
@pytest.mark.parametrize("fix_com", [True, False])
def test_canonical_temperature_and_kinetic_energy_fluctuations(fix_com: bool) -> None:
    """W1's parameters (50 K, dt 5 fs, friction 0.01/fs) on 8 argon cells of 32 atoms.

    In the canonical ensemble the kinetic energy of f quadratic degrees of freedom has mean
    f kT/2 and variance (f/2)(kT)^2 whatever the potential (f = 3N - 3 with the COM fixed, 3N
    without). Samples are correlated; the tolerances come from the effective number of
    independent samples n_eff = samples / tau_int, measured from the data: the standard error of
    the mean temperature is T sqrt(2/f) / sqrt(n_eff) (about 0.2 K here, so the 2 % = 1 K bound
    is 5 standard errors), and of the variance ratio sqrt(2 / n_eff) (about 4 %); 3 standard
    errors are allowed for the variance, and that tolerance itself must stay below 15 %. (The
    run is seeded, so the test is deterministic on a given machine.)
    """
    systems, steps, burn_in, target = 8, 3000, 300, 50.0
    batch = Batch.from_data_list([argon(2, rattle=0.02, seed=s) for s in range(systems)])
    record = Record(lambda b, d: kinetic_energy(b))
    nvt = Langevin(
        ReferenceLJ(), n_steps=steps, dt=5.0, temperature=target, friction=0.01, initial_temperature=target,
        random_seed=7, fix_com=fix_com, hooks=[record],
    )
    nvt.run(batch)
    ke = record.array()[burn_in:]
    dof = degrees_of_freedom(batch, com_fixed=fix_com)[0].item()
    kt = KB * target
    temperatures = 2.0 * ke / (dof * KB)
    tau = np.mean([integrated_autocorrelation_time(ke[:, s]) for s in range(systems)])
    n_eff = ke.size / tau
    mean_t = temperatures.mean()
    assert abs(mean_t - target) < 0.02 * target, f"mean temperature {mean_t:.2f} K"
    assert abs(mean_t - target) < 5 * target * math.sqrt(2 / dof / n_eff)
    variance_ratio = ke.var(axis=0).mean() / (0.5 * dof * kt * kt)
    tolerance = 3 * math.sqrt(2 / n_eff)
    print(f"T {mean_t:.3f} K, Var(KE) ratio {variance_ratio:.4f} +- {tolerance / 3:.4f}, n_eff {n_eff:.0f}")
    assert tolerance < 0.15, f"too few independent samples ({n_eff:.0f}) for a meaningful check"
    assert abs(variance_ratio - 1.0) < tolerance, f"Var(KE) / canonical = {variance_ratio:.3f} (n_eff {n_eff:.0f})"
    if fix_com:
        assert center_of_mass_velocity(batch).abs().max().item() < 1e-12


def test_the_centre_of_mass_stays_at_rest_in_systems_of_different_sizes_and_masses() -> None:
    """Systems of different sizes (1, 3, 5 and 2 atoms of mixed elements) and masses: each
    system's centre of mass stays at rest while its atoms move."""
    rng = np.random.default_rng(3)
    systems = []
    for n in (1, 3, 5, 2):
        numbers = torch.tensor(rng.choice([1, 8, 18, 54], size=n))
        systems.append(AtomicData(atomic_numbers=numbers, positions=torch.tensor(rng.normal(size=(n, 3)) * 3.0)))
    batch = Batch.from_data_list(systems)
    start = batch.positions.clone()
    Langevin(FreeAtoms(), n_steps=50, dt=2.0, temperature=300.0, friction=0.05, random_seed=1, fix_com=True).run(batch)
    assert center_of_mass_velocity(batch).abs().max().item() < 1e-12
    moved = (batch.positions - start).norm(dim=1)
    assert moved[1:].min().item() > 1e-3  # atoms of the systems of several atoms did move
    assert moved[0].item() < 1e-12  # a lone atom is its own centre of mass


@pytest.mark.parametrize("backend", BACKENDS)
def test_ornstein_uhlenbeck_step_is_exact(backend: str) -> None:
    """Free atoms starting at velocity u: after k steps each component has mean u c1^k and
    variance kT/m (1 - c1^2k), c1 = exp(-friction dt), for each system's own T and friction."""
    n_atoms, k, dt = 4000, 40, 2.0
    temps = torch.tensor([30.0, 300.0], dtype=torch.float64)
    friction = torch.tensor([0.02, 0.005], dtype=torch.float64)
    data = AtomicData(atomic_numbers=torch.full((n_atoms,), 18), positions=torch.zeros(n_atoms, 3, dtype=torch.float64))
    batch = Batch.from_data_list([data, data])
    u = torch.tensor([0.01, -0.02, 0.005], dtype=torch.float64)
    batch.set_field("velocities", u.repeat(2 * n_atoms, 1), "node")
    implementation(Langevin, backend)(FreeAtoms(), n_steps=k, dt=dt, temperature=temps, friction=friction, fix_com=False,
             random_seed=3).run(batch)
    v = batch.velocities.view(2, n_atoms, 3)
    mass = 39.948
    for s in range(2):
        c1 = math.exp(-friction[s].item() * dt)
        var = KB * temps[s].item() * 9.648533212331e-3 / mass * (1 - c1 ** (2 * k))
        mean_err = (v[s].mean(0) - u * c1**k).abs().max().item()
        assert mean_err < 5 * math.sqrt(var / n_atoms)
        assert v[s].var(0).mean().item() == pytest.approx(var, rel=5 * math.sqrt(2 / (3 * n_atoms)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_friction_is_velocity_verlet(backend: str) -> None:
    runs = []
    for cls, kwargs in ((Langevin, {"temperature": 300.0, "friction": 0.0}), (VelocityVerlet, {})):
        batch = Batch.from_data_list([argon(1, rattle=0.1, seed=1), argon(1, rattle=0.1, seed=2)])
        initialize_velocities(batch, 40.0, seed=0)
        implementation(cls, backend)(ReferenceLJ(), n_steps=50, dt=5.0, **kwargs).run(batch)
        runs.append(batch)
    torch.testing.assert_close(runs[0].positions, runs[1].positions, rtol=0, atol=1e-13)
    torch.testing.assert_close(runs[0].velocities, runs[1].velocities, rtol=0, atol=1e-15)


def test_noise_does_not_depend_on_the_batch_layout() -> None:
    """The kernel keys its noise by system, so a system's stochastic trajectory is the same
    alone and in a batch (and in any slot)."""
    together = Batch.from_data_list([argon(1, rattle=0.1, seed=s) for s in range(3)])
    together.set_field("system_id", torch.tensor([10, 11, 12]), "system")
    alone = together.index_select([2])
    for batch in (together, alone):
        Langevin(ReferenceLJ(), n_steps=30, dt=5.0, temperature=100.0, friction=0.05, random_seed=5).run(batch)
    torch.testing.assert_close(together.index_select([2]).positions, alone.positions, rtol=0, atol=1e-12)
    assert not torch.allclose(together.index_select([0]).positions, alone.positions)


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_seed_same_trajectory(backend: str) -> None:
    finals = []
    for seed in (1, 1, 2):
        batch = Batch.from_data_list([argon(1, rattle=0.1, seed=0)])
        implementation(Langevin, backend)(ReferenceLJ(), n_steps=20, dt=5.0, temperature=100.0, random_seed=seed).run(batch)
        finals.append(batch.positions)
    assert torch.equal(finals[0], finals[1])
    assert not torch.allclose(finals[0], finals[2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_from_checkpoint_gives_the_same_trajectory(backend: str) -> None:
    """Integrator state lives in batch fields plus the random state of state_dict(): saving both
    and resuming reproduces the uninterrupted run (to rounding: the resumed model builds its pair
    list afresh, which changes the order of its force sums in the last bit)."""

    def fresh() -> Langevin:
        return implementation(Langevin, backend)(ReferenceLJ(), n_steps=15, dt=5.0, temperature=80.0, friction=0.05, random_seed=21)

    batch = Batch.from_data_list([argon(1, rattle=0.1, seed=s) for s in range(2)])
    resumed, unrestored = resumed_run(fresh, batch)  # batch: the uninterrupted 30 steps
    torch.testing.assert_close(resumed.positions, batch.positions, rtol=0, atol=1e-13)
    torch.testing.assert_close(resumed.velocities, batch.velocities, rtol=0, atol=1e-15)
    # Without the random state, the oracle replays its first noise: another trajectory. The
    # production step keys its noise by each system's step counter, a batch field: it needs nothing more.
    differs = (unrestored.positions - batch.positions).abs().max().item() > 1e-6
    assert differs == (backend == "torch")


