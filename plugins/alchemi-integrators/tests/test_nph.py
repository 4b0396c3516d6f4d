"""NPH (MTK without thermostats) conserves its enthalpy, takes its oracle's steps and resumes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from integrators_testkit.lj_reference import ReferenceLJ, argon
from integrators_testkit.oracles import implementation
from integrators_testkit.resume import resumed_run

from alchemi_core import registry, units
from alchemi_core.data import Batch
from alchemi_integrators import NPH
from alchemi_integrators.npt_common import BAROSTAT_CHAIN_VELOCITIES, THERMOSTAT_POSITIONS, THERMOSTAT_VELOCITIES
from alchemi_integrators.thermo import initialize_velocities, temperature


def _argon_batch(n: int, strain: float = 1.0) -> Batch:
    data = []
    for s in range(n):
        d = argon(2, rattle=0.05, seed=s)
        d.cell, d.positions = d.cell * strain, d.positions * strain
        data.append(d)
    return Batch.from_data_list(data)


def test_registered() -> None:
    assert registry.resolve("integrator:nph") is NPH


@pytest.mark.parametrize("anisotropic", [False, True], ids=["isotropic", "anisotropic"])
def test_enthalpy_is_conserved(anisotropic: bool) -> None:
    """Two 32-atom argon cells strained by 2 %, at 50 K, dt 5 fs, tau_p 500 fs, target 0.1 GPa,
    for 4 ps: the volume moves by more than 1 % and the temperature changes, yet the enthalpy
    ``KE + E + p V + W |g|²/2`` stays within 5e-5 eV per atom of its start (measured 2.4e-5, an
    O(dt²) fluctuation: 6.5e-6 at dt 2.5 fs) and its linear drift over the run is below 1e-5 eV
    per atom (measured 5e-6). Leaving out p V or the barostat's kinetic energy moves it by 2e-3
    eV per atom."""
    batch = _argon_batch(2, strain=1.02)
    initialize_velocities(batch, 50.0, seed=1)
    nph = NPH(ReferenceLJ(), dt=5.0, pressure=0.1 * units.GPA, tau_p=500.0, temperature=50.0, anisotropic=anisotropic)
    nph.run(batch, n_steps=1)
    v0, t0 = torch.linalg.det(batch.cell).clone(), temperature(batch).clone()
    energies, volumes = [nph.conserved_energy(batch).clone()], []
    for _ in range(80):
        nph.run(batch, n_steps=10)
        energies.append(nph.conserved_energy(batch).clone())
        volumes.append(torch.linalg.det(batch.cell) / v0)
    e = torch.stack(energies).numpy() / 32
    assert np.abs(e - e[0]).max() < 5e-5
    times = np.arange(len(e)) * 50.0
    for s in range(2):
        assert abs(np.polyfit(times, e[:, s], 1)[0]) * times[-1] < 1e-5
    v = torch.stack(volumes)
    assert (v.max(0).values - v.min(0).values).min().item() > 1e-2  # the volume moved
    assert (temperature(batch) - t0).abs().min().item() > 1.0  # no thermostat holds the temperature
    torch.testing.assert_close(nph.conserved_energy(batch), nph.enthalpy(batch), rtol=0, atol=0)
    for name in (THERMOSTAT_POSITIONS, THERMOSTAT_VELOCITIES, BAROSTAT_CHAIN_VELOCITIES):
        assert not getattr(batch, name).any(), name  # the chains never moved


def test_production_takes_the_oracles_steps() -> None:
    """Four float64 cells at per-system pressures (a field), 60 steps, anisotropic: the Warp
    kernels and the torch oracle agree in every state field and the enthalpy to rounding."""
    final = {}
    for backend in ("torch", "warp"):
        batch = _argon_batch(4, strain=1.01)
        batch.set_field("p_target", torch.tensor([0.0, 0.1, 0.2, -0.05], dtype=torch.float64) * units.GPA, "system")
        initialize_velocities(batch, 50.0, seed=3)
        nph = implementation(NPH, backend)(ReferenceLJ(), n_steps=60, dt=5.0, pressure="p_target", tau_p=200.0,
                                           temperature=50.0, anisotropic=True)
        nph.run(batch)
        final[backend] = (batch, nph.conserved_energy(batch))
    (a, ea), (b, eb) = final["warp"], final["torch"]
    for field in ("positions", "velocities", "cell", "npt_strain_rate"):
        torch.testing.assert_close(getattr(a, field), getattr(b, field), rtol=1e-11, atol=1e-12, msg=field)
    torch.testing.assert_close(ea, eb, rtol=1e-11, atol=1e-11)


def test_resume_from_checkpoint_gives_the_same_trajectory() -> None:
    """NPH's state is in batch fields: a run resumed from the saved batch is the uninterrupted one."""

    def fresh() -> NPH:
        return NPH(ReferenceLJ(), n_steps=15, dt=5.0, pressure=0.1 * units.GPA, tau_p=200.0, temperature=50.0)

    batch = _argon_batch(2, strain=1.01)
    initialize_velocities(batch, 50.0, seed=4)
    resumed, _ = resumed_run(fresh, batch)
    for field in ("positions", "velocities", "cell", "npt_strain_rate"):
        torch.testing.assert_close(getattr(resumed, field), getattr(batch, field), rtol=0, atol=1e-12, msg=field)
