"""Lennard-Jones with the tail correction against NIST's published Monte Carlo table.

Reference: NIST Standard Reference Simulation Website (SRSW), "Lennard-Jones Fluid Properties",
https://mmlapps.nist.gov/srs/LJ_PURE/mc.htm: NVT Monte Carlo of N = 500 particles, the potential
truncated at 3 sigma with the analytic long-range corrections to energy and pressure, in reduced
units (energy per particle U/(N eps), pressure P sigma^3/eps). The table's values at rho* = 0.776:

    T* = 0.85:  U* = -5.5121 +- 4.55e-4,  P* = 6.7714e-3
    T* = 0.90:  U* = -5.4689 +- 4.20e-4,  P* = 2.4056e-1

(the pressures' published uncertainties, of order 1e-3, are an order of magnitude below this
test's own and are left out of its tolerance). The test runs both state points as one batch of
Langevin (BAOAB) argon in real units (eps = 0.0104 eV, sigma = 3.405 Å, m = 39.948 amu; tau =
sigma sqrt(m/eps) ~ 2.15 ps) with ``shift="none"`` and ``tail_correction=True``, two replicas
each, and compares the means within three standard errors from block averages.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from ase import units
from ase.build import bulk

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.dynamics import Hook

EPS, SIG, MASS = 0.0104, 3.405, 39.948
RHO = 0.776
#: (T*, U*, its published uncertainty, P*) from the SRSW table (see the module docstring).
NIST = ((0.85, -5.5121, 4.55e-4, 6.7714e-3), (0.90, -5.4689, 4.20e-4, 2.4056e-1))
REPLICAS = 2


class Record(Hook):
    """Every ``frequency`` steps, each system's potential energy and virial pressure (eV/Å³)."""

    needs_stress = True

    def __init__(self, frequency: int) -> None:
        super().__init__(frequency=frequency)
        self.energy: list[torch.Tensor] = []
        self.virial_pressure: list[torch.Tensor] = []

    def __call__(self, batch: Batch, dynamics: object) -> None:
        self.energy.append(batch.energy.detach().reshape(-1).clone())
        self.virial_pressure.append(-batch.stress.detach().diagonal(dim1=1, dim2=2).mean(-1))


def block_mean_and_error(series: np.ndarray, blocks: int = 10) -> tuple[float, float]:
    """Mean of ``series`` ``[samples, replicas]`` and its standard error from the spread of the
    means of ``blocks`` consecutive blocks of every replica (blocks long enough to be independent)."""
    n = series.shape[0] // blocks * blocks
    means = series[:n].reshape(blocks, n // blocks, -1).mean(axis=1).reshape(-1)
    return float(means.mean()), float(means.std(ddof=1) / math.sqrt(len(means)))


@pytest.mark.slow  # 11,000 steps of 2,000 atoms: 1-3 minutes on two CPU cores
def test_tail_corrected_lj_reproduces_nist_mc_table() -> None:
    a = (4 / RHO) ** (1 / 3) * SIG  # fcc start at the state point's density
    crystal = bulk("Ar", "fcc", a=a, cubic=True).repeat(5)
    assert len(crystal) == 500
    temps = [t for t, *_ in NIST for _ in range(REPLICAS)]
    kelvin = torch.tensor(temps, dtype=torch.float64) * EPS / units.kB
    model = registry.build("model:lennard-jones", epsilon=EPS, sigma=SIG, cutoff=3 * SIG, shift="none",
                           tail_correction=True)

    def langevin(n_steps: int, hooks: list[Hook]) -> object:
        return registry.build("integrator:langevin", model=model, n_steps=n_steps, dt=10.0, temperature=kelvin,
                              friction=0.002, initial_temperature=kelvin, random_seed=7, hooks=hooks)

    batch = Batch.from_atoms([crystal] * len(temps), dtype=torch.float64)
    batch = langevin(3000, []).run(batch)  # melt and equilibrate: ~14 tau
    record = Record(frequency=10)
    langevin(8000, [record]).run(batch)  # ~37 tau of production, 800 samples

    n, volume = len(crystal), crystal.get_volume()
    energy = torch.stack(record.energy).numpy() / (n * EPS)
    virial = torch.stack(record.virial_pressure).numpy() * SIG**3 / EPS
    for k, (t, u_ref, u_err, p_ref) in enumerate(NIST):
        cols = slice(k * REPLICAS, (k + 1) * REPLICAS)
        u, u_se = block_mean_and_error(energy[:, cols])
        # NIST's estimator: the ideal-gas term at the set temperature plus the configurational virial.
        p, p_se = block_mean_and_error(n / volume * SIG**3 * t + virial[:, cols])
        assert u_se < 0.01 and p_se < 0.05, f"T*={t}: too few independent samples (U* se {u_se}, P* se {p_se})"
        assert abs(u - u_ref) < 3 * math.hypot(u_se, u_err), f"T*={t}: U* {u:.4f} +- {u_se:.4f}, NIST {u_ref}"
        assert abs(p - p_ref) < 3 * p_se, f"T*={t}: P* {p:.4f} +- {p_se:.4f}, NIST {p_ref}"
