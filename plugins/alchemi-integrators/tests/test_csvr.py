"""CSVR (stochastic velocity rescaling) samples the canonical ensemble, keeps its effective energy,
and takes its torch oracle's steps with the same random numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from integrators_testkit.lj_reference import ReferenceLJ, argon
from integrators_testkit.oracles import implementation
from integrators_testkit.recording import Record, integrated_autocorrelation_time
from integrators_testkit.resume import resumed_run

from alchemi_core import registry
from alchemi_core.data import AtomicData, Batch
from alchemi_core.units import KB
from alchemi_integrators import CSVR, VelocityVerlet
from alchemi_integrators.csvr import NOISE_COUNTER, THERMOSTAT_ENERGY
from alchemi_integrators.thermo import (
    center_of_mass_velocity,
    degrees_of_freedom,
    initialize_velocities,
    kinetic_energy,
)


class FreeAtoms:
    """Zero forces: the kinetic energy changes only by the thermostat's rescaling."""

    def __call__(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        return {"energy": batch.energy.zero_(), "forces": batch.forces.zero_()}


def _argon(n: int, dtype: torch.dtype = torch.float64) -> Batch:
    return Batch.from_data_list([argon(2, rattle=0.02, seed=s, dtype=dtype) for s in range(n)])


def test_registered() -> None:
    assert registry.resolve("integrator:csvr") is CSVR


@pytest.mark.slow  # a long sampled trajectory
def test_canonical_temperature_and_kinetic_energy_fluctuations() -> None:
    """Eight argon cells of 32 atoms at 40, 50, 60 and 70 K (two each, a per-system tensor),
    dt 5 fs, tau 50 fs. Canonically each system's kinetic energy K has mean N_f kT/2 and
    variance (N_f/2)(kT)² whatever the potential (N_f = 3N - 3). Pooled over systems, K / (N_f kT/2)
    has mean 1 and variance 2/N_f. The samples are correlated; the tolerances come from the
    effective number of independent samples n_eff = samples / tau_int measured from the data:
    the mean within 4 standard errors (sqrt(2/N_f/n_eff), ~0.5 %), the variance ratio within 3
    (sqrt(2/n_eff), ~4 %), and that tolerance itself must stay below 15 %."""
    targets = torch.tensor([40.0, 50.0, 60.0, 70.0] * 2, dtype=torch.float64)
    systems, steps, burn_in = 8, 3000, 300
    batch = _argon(systems)
    record = Record(lambda b, d: kinetic_energy(b))
    nvt = CSVR(ReferenceLJ(), n_steps=steps, dt=5.0, temperature=targets, tau=50.0, initial_temperature=targets,
               random_seed=7, hooks=[record])
    nvt.run(batch)
    nf = degrees_of_freedom(batch)[0].item()
    assert nf == 93
    ratio = record.array()[burn_in:] / (0.5 * nf * KB * targets.numpy())  # [samples, systems]
    tau = np.mean([integrated_autocorrelation_time(ratio[:, s]) for s in range(systems)])
    n_eff = ratio.size / tau
    mean = ratio.mean()
    variance_ratio = ratio.var(axis=0).mean() / (2.0 / nf)
    tolerance = 3 * math.sqrt(2 / n_eff)
    print(f"<K>/K0 {mean:.4f}, Var(K) ratio {variance_ratio:.4f} +- {tolerance / 3:.4f}, n_eff {n_eff:.0f}")
    assert abs(mean - 1.0) < 4 * math.sqrt(2 / nf / n_eff), f"mean K / K0 = {mean:.4f}"
    assert tolerance < 0.15, f"too few independent samples ({n_eff:.0f}) for a meaningful check"
    assert abs(variance_ratio - 1.0) < tolerance, f"Var(K) / canonical = {variance_ratio:.3f} (n_eff {n_eff:.0f})"
    per_system = 2.0 * record.array()[burn_in:].mean(axis=0) / (nf * KB)
    np.testing.assert_allclose(per_system, targets.numpy(), rtol=0.03)  # each system its own target
    assert center_of_mass_velocity(batch).abs().max().item() < 1e-12


def test_a_short_tau_draws_the_canonical_kinetic_energy_in_one_step() -> None:
    """With tau << dt (c = exp(-dt/tau) = 0) one step draws each system's kinetic energy afresh
    from the canonical distribution, whatever it was: 2 K / kT is chi-squared with N_f degrees of
    freedom. Over 4000 free systems of 2, 4 and 5 atoms (N_f = 3, 9, 12): mean N_f and variance
    2 N_f within five standard errors, and the distribution is chi-squared's (two-sample
    Kolmogorov-Smirnov at 0.1 %)."""
    count, temp = 4000, 120.0
    for atoms in (2, 4, 5):
        data = AtomicData(atomic_numbers=torch.full((atoms,), 18), positions=torch.randn(atoms, 3, dtype=torch.float64))
        batch = Batch.from_data_list([data] * count)
        initialize_velocities(batch, 10.0, seed=atoms)
        CSVR(FreeAtoms(), n_steps=1, dt=1.0, temperature=temp, tau=1e-6, random_seed=atoms).run(batch)
        nf = 3 * atoms - 3
        x = 2.0 * kinetic_energy(batch) / (KB * temp)
        assert abs(x.mean().item() - nf) < 5 * math.sqrt(2 * nf / count)
        assert abs(x.var().item() / (2 * nf) - 1) < 5 * math.sqrt(2 / count) * math.sqrt(1 + 6 / nf)
        reference = (torch.randn(count, nf, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) ** 2).sum(1)
        pooled = torch.cat([x, reference])
        cdfs = [torch.searchsorted(s.sort().values, pooled, right=True) for s in (x, reference)]
        assert (cdfs[0] - cdfs[1]).abs().max().item() / count < 1.95 * math.sqrt(2.0 / count)


def test_effective_energy_is_conserved() -> None:
    """Bussi's effective energy (KE + E_pot + the energy the thermostat took out) of two 32-atom
    argon cells, 50 K, dt 5 fs, tau 100 fs, heated from 20 K over 2 ps: within 3e-5 eV per atom of
    its start while the thermostat moves ~0.1 eV in (checked), the NVE fluctuation at this dt."""
    batch = _argon(2)
    initialize_velocities(batch, 20.0, seed=1)
    nvt = CSVR(ReferenceLJ(), dt=5.0, temperature=50.0, tau=100.0, random_seed=2)
    nvt.run(batch, n_steps=1)
    energies = [nvt.conserved_energy(batch).clone()]
    for _ in range(40):
        nvt.run(batch, n_steps=10)
        energies.append(nvt.conserved_energy(batch).clone())
    e = torch.stack(energies) / 32
    assert (e - e[0]).abs().max().item() < 3e-5
    assert getattr(batch, THERMOSTAT_ENERGY).max().item() < -0.05  # heat went in


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed-noise", "noise-off"])
def test_production_takes_the_oracles_steps(fixed: bool) -> None:
    """Three float64 argon cells at per-system temperatures and relaxation times: 40 steps of the
    Warp kernels and of the torch oracle agree in every state field to rounding, the oracle
    using the kernels' keyed random numbers (fixed noise) or, with tau huge, none (noise off:
    then CSVR is velocity Verlet)."""
    final = {}
    tau = torch.tensor([20.0, 50.0, 500.0]) if fixed else 1e30
    for backend in ("torch", "warp"):
        batch = Batch.from_data_list([argon(1, rattle=0.1, seed=s) for s in range(3)])
        initialize_velocities(batch, 40.0, seed=0)
        nvt = implementation(CSVR, backend)(ReferenceLJ(), n_steps=40, dt=5.0,
                                            temperature=torch.tensor([30.0, 60.0, 90.0]), tau=tau, random_seed=3)
        nvt.run(batch)
        final[backend] = (batch, nvt.conserved_energy(batch))
    (a, ea), (b, eb) = final["warp"], final["torch"]
    for field in ("positions", "velocities", NOISE_COUNTER, THERMOSTAT_ENERGY):
        torch.testing.assert_close(getattr(a, field), getattr(b, field), rtol=1e-12, atol=1e-13, msg=field)
    torch.testing.assert_close(ea, eb, rtol=1e-12, atol=1e-12)
    assert a.csvr_noise_step.tolist() == [40, 40, 40]
    if not fixed:
        nve = Batch.from_data_list([argon(1, rattle=0.1, seed=s) for s in range(3)])
        initialize_velocities(nve, 40.0, seed=0)
        VelocityVerlet(ReferenceLJ(), n_steps=40, dt=5.0).run(nve)
        torch.testing.assert_close(a.positions, nve.positions, rtol=0, atol=1e-12)
    else:
        assert getattr(a, THERMOSTAT_ENERGY).abs().min().item() > 1e-4  # the thermostat worked


def test_float32_agrees_with_the_oracle_to_its_rounding() -> None:
    final = {}
    for backend in ("torch", "warp"):
        batch = _argon(2, dtype=torch.float32)
        initialize_velocities(batch, 40.0, seed=0)
        implementation(CSVR, backend)(ReferenceLJ(), n_steps=20, dt=5.0, temperature=60.0, tau=30.0,
                                      random_seed=3).run(batch)
        final[backend] = batch
    torch.testing.assert_close(final["warp"].positions, final["torch"].positions, rtol=0, atol=1e-4)
    torch.testing.assert_close(final["warp"].velocities, final["torch"].velocities, rtol=1e-3, atol=1e-6)


def test_noise_does_not_depend_on_the_batch_layout() -> None:
    """Draws are keyed by system: a system's trajectory is the same alone and in a batch."""
    together = Batch.from_data_list([argon(1, rattle=0.1, seed=s) for s in range(3)])
    together.set_field("system_id", torch.tensor([10, 11, 12]), "system")
    initialize_velocities(together, 40.0, seed=0)
    alone = together.index_select([2])
    for batch in (together, alone):
        CSVR(ReferenceLJ(), n_steps=30, dt=5.0, temperature=100.0, tau=20.0, random_seed=5).run(batch)
    torch.testing.assert_close(together.index_select([2]).positions, alone.positions, rtol=0, atol=1e-12)
    assert not torch.allclose(together.index_select([0]).positions, alone.positions)


def test_same_seed_same_trajectory() -> None:
    finals = []
    for seed in (1, 1, 2):
        batch = Batch.from_data_list([argon(1, rattle=0.1, seed=0)])
        initialize_velocities(batch, 40.0, seed=0)
        CSVR(ReferenceLJ(), n_steps=20, dt=5.0, temperature=100.0, tau=20.0, random_seed=seed).run(batch)
        finals.append(batch.velocities)
    assert torch.equal(finals[0], finals[1])
    assert not torch.allclose(finals[0], finals[2])


@pytest.mark.parametrize("backend", ["torch", "warp"])
def test_resume_from_checkpoint_gives_the_same_trajectory(backend: str) -> None:
    """The draws are keyed by each system's step counter, a batch field: a run resumed from the
    saved batch reproduces the uninterrupted one, with or without the integrator's state_dict."""

    def fresh() -> CSVR:
        return implementation(CSVR, backend)(ReferenceLJ(), n_steps=15, dt=5.0, temperature=80.0, tau=20.0,
                                             random_seed=21)

    batch = Batch.from_data_list([argon(1, rattle=0.1, seed=s) for s in range(2)])
    initialize_velocities(batch, 40.0, seed=0)
    resumed, unrestored = resumed_run(fresh, batch)  # batch: the uninterrupted 30 steps
    for other in (resumed, unrestored):
        torch.testing.assert_close(other.positions, batch.positions, rtol=0, atol=1e-13)
        torch.testing.assert_close(other.velocities, batch.velocities, rtol=0, atol=1e-15)


def test_held_atoms_and_components_leave_the_degrees_of_freedom_that_move() -> None:
    """Two-atom systems whose first atom is held (``frozen``) and whose second has its x held
    (``frozen_axes``): N_f = 2 (held atoms pin the centre of mass, as ASE counts it), so with
    tau << dt one step draws 2 K / kT from chi-squared with 2 degrees of freedom (the first
    normal squared plus twice a Gamma(1/2): the gamma draw's boost below shape 1), over 4000
    systems: mean 2 and variance
    4 within five standard errors, two-sample Kolmogorov-Smirnov at 0.1 %. The held coordinates
    keep zero velocity."""
    count, temp = 4000, 80.0
    data = AtomicData(atomic_numbers=torch.full((2,), 18), positions=torch.tensor([[0.0, 0, 0], [3.0, 0, 0]]))
    batch = Batch.from_data_list([data] * count)
    batch.set_field("frozen", torch.tensor([True, False]).repeat(count), "node")
    batch.set_field("frozen_axes", torch.tensor([[False, False, False], [True, False, False]]).repeat(count, 1), "node")
    initialize_velocities(batch, 10.0, seed=3)
    CSVR(FreeAtoms(), n_steps=1, dt=1.0, temperature=temp, tau=1e-6, random_seed=4).run(batch)
    assert degrees_of_freedom(batch).unique().tolist() == [2.0]
    v = batch.velocities.view(count, 2, 3)
    assert not v[:, 0].any() and not v[:, 1, 0].any()
    x = 2.0 * kinetic_energy(batch) / (KB * temp)
    assert abs(x.mean().item() - 2.0) < 5 * math.sqrt(4.0 / count)
    assert abs(x.var().item() / 4.0 - 1) < 5 * math.sqrt(2 / count) * math.sqrt(1 + 6 / 2)
    reference = (torch.randn(count, 2, dtype=x.dtype, generator=torch.Generator().manual_seed(2)) ** 2).sum(1)
    pooled = torch.cat([x, reference])
    cdfs = [torch.searchsorted(s.sort().values, pooled, right=True) for s in (x, reference)]
    assert (cdfs[0] - cdfs[1]).abs().max().item() / count < 1.95 * math.sqrt(2.0 / count)
