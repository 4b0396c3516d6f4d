"""Nose-Hoover chains conserve their extended energy and thermostat each system to its own T."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from integrators_testkit.lj_reference import ReferenceLJ, argon
from integrators_testkit.recording import Record, integrated_autocorrelation_time

from alchemi_core.data import Batch
from alchemi_core.errors import ConfigurationError
from alchemi_integrators import NoseHooverChain
from alchemi_integrators.nose_hoover import CHAIN_POSITIONS, CHAIN_VELOCITIES, YOSHIDA_WEIGHTS
from alchemi_integrators.thermo import temperature


@pytest.mark.slow  # a long sampled trajectory (the oldest-Warp run leaves it out)
def test_conserved_energy_and_per_system_temperatures() -> None:
    """Four float32 argon cells (32 atoms) thermostatted to 40, 50, 50 and 60 K (a per-system
    tensor) for 4000 steps of 5 fs, tau = 250 fs, starting at 80 K, on the default backend
    (test_backends.py checks that the other backend takes the same steps).

    * The extended energy H (KE + E_pot + thermostat energy) must stay within 1e-3 eV of its
      start (3e-5 eV per atom) and drift by less than 2e-4 eV over the 20 ps, the NVE bounds of
      test_nve.py: its fluctuation has the same O(dt²) origin (measured 2e-4 eV). The kinetic
      and potential energies themselves change by ~0.3 eV as the systems cool, so a thermostat
      force or chain term that is wrong by even 1 % breaks the bound.
    * Each system's mean temperature after 4 ps of equilibration must be within 5 % of its
      target (the standard error from ~100 independent samples per system is ~1.5 %), and the
      40 K and 60 K systems must differ by the 20 K they were asked to.
    """
    targets = torch.tensor([40.0, 50.0, 50.0, 60.0])
    batch = Batch.from_data_list([argon(2, rattle=0.02, seed=s, dtype=torch.float32) for s in range(4)])
    energy = Record(lambda b, d: d.conserved_energy(b), frequency=10)
    temps = Record(lambda b, d: temperature(b), frequency=10)
    nvt = NoseHooverChain(
        ReferenceLJ(), n_steps=4000, dt=5.0, temperature=targets, tau=250.0, initial_temperature=80.0,
        random_seed=4, hooks=[energy, temps],
    )
    nvt.run(batch)
    h = energy.array()
    times = np.arange(len(h)) * 50.0
    for s in range(4):
        assert np.abs(h[:, s] - h[0, s]).max() < 1e-3
        assert abs(np.polyfit(times, h[:, s], 1)[0]) * times[-1] < 2e-4
    t = temps.array()[80:]
    means = t.mean(axis=0)
    np.testing.assert_allclose(means, targets.numpy(), rtol=0.05)
    tau = np.mean([integrated_autocorrelation_time(t[:, s]) for s in range(4)])
    assert t.shape[0] / tau > 30, "too few independent samples for the 5 % bound"
    assert 15.0 < means[3] - means[0] < 25.0
    # The chain really worked: thermostat variables moved and carry the energy taken out.
    assert getattr(batch, CHAIN_VELOCITIES).abs().min().item() > 0
    assert getattr(batch, CHAIN_POSITIONS)[:, 0].abs().min().item() > 0


def test_half_step_matches_a_hand_computed_chain() -> None:
    """One thermostat half-step of a 2-chain with Yoshida order 1, against the MTK formulas
    written out for a single system."""
    from integrators_testkit.oracles import nhc_half_step

    ke, nf, kt, q1, q2, half = 0.7, 9.0, 0.05, 4.0, 2.0, 3.0
    v1, v2, x1, x2 = 0.01, -0.02, 0.1, 0.2
    # By hand: h = half; v2 += h/2 G2; v1 = (v1 e + h/2 G1) e with e = exp(-h/4 v2); s = exp(-h v1);
    # x += h v; then v1 again (with the scaled KE), then v2.
    h = half
    v2 += h / 2 * (q1 * v1**2 - kt) / q2
    e = np.exp(-h / 4 * v2)
    v1 = (v1 * e + h / 2 * (2 * ke - nf * kt) / q1) * e
    s = np.exp(-h * v1)
    ke_s = ke * s * s
    x1, x2 = x1 + h * v1, x2 + h * v2
    e = np.exp(-h / 4 * v2)
    v1 = (v1 * e + h / 2 * (2 * ke_s - nf * kt) / q1) * e
    v2 += h / 2 * (q1 * v1**2 - kt) / q2

    t = lambda *x: torch.tensor([list(x)], dtype=torch.float64)  # noqa: E731
    xi, vxi = t(0.1, 0.2), t(0.01, -0.02)
    scale = nhc_half_step(
        torch.tensor([ke], dtype=torch.float64), xi, vxi, t(q1, q2), torch.tensor([kt], dtype=torch.float64),
        torch.tensor([nf], dtype=torch.float64), torch.tensor([half], dtype=torch.float64), YOSHIDA_WEIGHTS[1], 1,
    )
    np.testing.assert_allclose(scale.numpy(), [s], rtol=1e-14)
    np.testing.assert_allclose(xi.numpy()[0], [x1, x2], rtol=1e-14)
    np.testing.assert_allclose(vxi.numpy()[0], [v1, v2], rtol=1e-14)


def test_yoshida_weights_sum_to_one() -> None:
    for weights in YOSHIDA_WEIGHTS.values():
        assert sum(weights) == pytest.approx(1.0, abs=1e-15)


def test_bad_chain_settings_are_errors() -> None:
    model = ReferenceLJ()
    with pytest.raises(ConfigurationError, match="chain_length"):
        NoseHooverChain(model, chain_length=0)
    with pytest.raises(ConfigurationError, match="yoshida_order"):
        NoseHooverChain(model, yoshida_order=2)
    with pytest.raises(ConfigurationError, match="tau must be > 0"):
        NoseHooverChain(model, tau=0.0)
    with pytest.raises(ConfigurationError, match="temperature must be > 0"):
        NoseHooverChain(model, temperature=0.0)
