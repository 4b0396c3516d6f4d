"""Lennard-Jones cutoff conventions: ``shift="none" | "energy" | "force"`` and the analytic tail
correction, against independent formulas and finite differences."""

from __future__ import annotations

import math

import ase
import numpy as np
import pytest
import torch

from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_potentials import LennardJones

EPS, SIG, RC = 0.0104, 3.405, 8.5125


def lj(r, eps=EPS, sig=SIG):
    return 4 * eps * ((sig / r) ** 12 - (sig / r) ** 6)


def dlj(r, eps=EPS, sig=SIG):
    return 4 * eps * (-12 * sig**12 / r**13 + 6 * sig**6 / r**7)


def shifted_force_pair(zi, zj, r):
    u = lj(r) - lj(RC) - (r - RC) * dlj(RC)
    return u, dlj(r) - dlj(RC)


def dimer(r: float) -> ase.Atoms:
    return ase.Atoms("Ar2", positions=[[5, 5, 5], [5 + r, 5, 5]], cell=np.eye(3) * 40, pbc=True)


def test_shifted_force_matches_numpy_reference(ref, rng, tuning):
    atoms = [ref.atoms(rng, 20, ref.cell(rng, (11.0, 12.0, 10.0), 0.3), True) for _ in range(2)]
    model = LennardJones(EPS, SIG, RC, shift="force", tuning=tuning)
    out = model(ref.batch(atoms), compute_stress=True)
    for s, a in enumerate(atoms):
        e, f, w = ref.pairs(a.positions, a.numbers, a.cell.array, a.pbc, RC, shifted_force_pair)
        assert abs(out["energy"][s, 0].item() - e) <= 1e-9 + 1e-6 * abs(e)
        ref.close(out["forces"][20 * s : 20 * (s + 1)], f, what="forces")
        ref.close(out["stress"][s], w / abs(np.linalg.det(a.cell.array)), what="stress")


@pytest.mark.parametrize("shift", ["none", "energy", "force"])
def test_force_is_continuous_at_the_cutoff_only_when_force_shifted(ref, shift, tuning):
    model = LennardJones(EPS, SIG, RC, shift=shift, tuning=tuning)
    out = model(ref.batch([dimer(RC - 1e-6), dimer(RC + 1e-6)]))
    f_inside = out["forces"][0, 0].item()
    assert out["forces"][2:].abs().max().item() == 0.0  # beyond the cutoff: nothing
    if shift == "force":
        assert abs(f_inside) < 1e-9 and abs(out["energy"][0, 0].item()) < 1e-12
    else:
        assert f_inside == pytest.approx(dlj(RC), rel=1e-5)  # the jump the force shift removes


def test_none_and_energy_differ_by_the_pair_count_times_u_at_the_cutoff(ref, rng, tuning):
    atoms = ref.atoms(rng, 24, ref.cell(rng, (11.0, 12.0, 10.5), 0.3), True)
    batch = ref.batch([atoms])
    plain = LennardJones(EPS, SIG, RC, shift="none", tuning=tuning)(batch)
    shifted = LennardJones(EPS, SIG, RC, shift="energy", tuning=tuning)(batch)
    # The "energy" of the pair function 1 is the number of pairs within the cutoff.
    pairs, _, _ = ref.pairs(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc, RC,
                            lambda zi, zj, r: (np.ones_like(r), np.zeros_like(r)))
    assert pairs > 100
    diff = plain["energy"].item() - shifted["energy"].item()
    assert diff == pytest.approx(pairs * lj(RC), rel=1e-8)
    torch.testing.assert_close(plain["forces"], shifted["forces"])


def test_shift_options_are_checked():
    assert LennardJones(EPS, SIG, RC, shift_energy=True).shift == "energy"
    assert LennardJones(EPS, SIG, RC).shift == "none"  # the default is unchanged: truncated
    with pytest.raises(ConfigurationError, match="shift must be one of"):
        LennardJones(EPS, SIG, RC, shift="smooth")
    with pytest.raises(ConfigurationError, match="contradicts"):
        LennardJones(EPS, SIG, RC, shift_energy=True, shift="force")
    with pytest.raises(ConfigurationError, match="not both"):
        LennardJones(EPS, SIG, RC, shift="force", switch_onset=7.0)


def tail_formulas(numbers, volume, eps, sig, rc):
    """The textbook homogeneous tails, summed over ordered species pairs (Allen & Tildesley 2.8)."""
    e = p = 0.0
    for zi, ni in zip(*np.unique(numbers, return_counts=True)):
        for zj, nj in zip(*np.unique(numbers, return_counts=True)):
            ep, sg = eps(zi, zj), sig(zi, zj)
            rho_i, rho_j, x = ni / volume, nj / volume, sg / rc
            e += ni * rho_j * (8 / 3) * math.pi * ep * sg**3 * (x**9 / 3 - x**3)
            p += rho_i * rho_j * (16 / 3) * math.pi * ep * sg**3 * (2 * x**9 / 3 - x**3)
    return e, p


def test_tail_energy_and_pressure_match_the_formulas_for_a_mixture(ref, rng, tuning):
    eps = {18: 0.0104, 36: 0.0141}
    sig = {18: 3.405, 36: 3.65}
    atoms = [ref.atoms(rng, n, ref.cell(rng, size, 0.2), True, species=(18, 36), min_distance=2.9)
             for n, size in ((30, (12.0, 12.5, 13.0)), (18, (11.0, 10.5, 12.0)))]
    batch = ref.batch(atoms)
    kw = dict(epsilon=eps, sigma=sig, cutoff=9.0, tuning=tuning)
    plain = LennardJones(**kw)(batch, compute_stress=True)
    tail = LennardJones(**kw, tail_correction=True)(batch, compute_stress=True)
    e_mix = lambda a, b: math.sqrt(eps[a] * eps[b])  # noqa: E731 - Lorentz-Berthelot
    s_mix = lambda a, b: 0.5 * (sig[a] + sig[b])  # noqa: E731
    for s, a in enumerate(atoms):
        assert len(set(a.numbers)) == 2
        e, p = tail_formulas(a.numbers, a.get_volume(), e_mix, s_mix, 9.0)
        assert e < 0 and p < 0
        assert tail["energy"][s, 0].item() - plain["energy"][s, 0].item() == pytest.approx(e, rel=1e-9)
        torch.testing.assert_close(tail["stress"][s] - plain["stress"][s], -p * torch.eye(3, dtype=torch.float64),
                                   rtol=1e-9, atol=1e-15)
        torch.testing.assert_close(tail["forces"], plain["forces"])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tail_follows_the_composition_call_after_call(ref, rng, tuning, dtype):
    """The counts come from the neighbour list's slots each forward: repeated calls and a batch
    with other species in the same shapes both get their own tail."""
    eps, sig = {18: 0.0104, 36: 0.0141}, {18: 3.405, 36: 3.65}
    model = LennardJones(eps, sig, 9.0, tail_correction=True, tuning=tuning)
    plain = LennardJones(eps, sig, 9.0, tuning=tuning)
    atoms = ref.atoms(rng, 24, np.eye(3) * 12.5, True, species=(18, 36), min_distance=3.0)
    swapped = atoms.copy()
    swapped.numbers = np.where(atoms.numbers == 18, 36, 18)
    e_mix = lambda a, b: math.sqrt(eps[a] * eps[b])  # noqa: E731
    s_mix = lambda a, b: 0.5 * (sig[a] + sig[b])  # noqa: E731
    for a in (atoms, atoms, swapped):
        batch = ref.batch([a], dtype=dtype)
        e, _ = tail_formulas(a.numbers, a.get_volume(), e_mix, s_mix, 9.0)
        rel = 1e-9 if dtype == torch.float64 else 1e-4
        assert (model(batch)["energy"] - plain(batch)["energy"]).item() == pytest.approx(e, rel=rel)


def test_tail_pressure_is_the_volume_derivative_plus_the_impulsive_term(ref, rng, tuning):
    """-dE_tail/dV at fixed N (finite differences of the model's energies) plus the mean impulsive
    term of the truncation, (2/3) pi rho^2 r_c^3 U(r_c), is the stress's P_tail."""
    base = ref.atoms(rng, 32, np.eye(3) * 12.0, True, min_distance=3.0)

    def tail_energy(scale):
        a = base.copy()
        a.set_cell(base.cell * scale, scale_atoms=True)
        batch = ref.batch([a])
        on = LennardJones(EPS, SIG, RC, tail_correction=True, tuning=tuning)(batch, compute_stress=True)
        off = LennardJones(EPS, SIG, RC, tuning=tuning)(batch, compute_stress=True)
        p_tail = -(on["stress"] - off["stress"])[0].diagonal().mean().item()
        return (on["energy"] - off["energy"]).item(), a.get_volume(), p_tail

    h = 1e-4
    (e1, v1, _), (_, v0, p_tail), (e2, v2, _) = tail_energy(1 - h), tail_energy(1.0), tail_energy(1 + h)
    rho = 32 / v0
    impulsive = (2 / 3) * math.pi * rho**2 * RC**3 * lj(RC)
    assert -(e2 - e1) / (v2 - v1) + impulsive == pytest.approx(p_tail, rel=1e-6)


def test_tail_correction_refuses_a_system_that_is_not_periodic(ref, rng, tuning):
    slab = ref.atoms(rng, 10, np.diag([10.0, 10.0, 20.0]), (True, True, False))
    with pytest.raises(InvalidDataError, match="periodic along all three axes"):
        LennardJones(EPS, SIG, RC, tail_correction=True, tuning=tuning)(ref.batch([slab]))
