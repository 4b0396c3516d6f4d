"""``equation_of_state`` against ASE's own: the same volumes, energies ASE computes itself, and
ASE's ``EquationOfState`` on them; every structure accounted for, failures with their reason."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.eos import EquationOfState
from ase.optimize import FIRE

from alchemi_core.data import AtomicData, Batch
from alchemi_properties import equation_of_state


def _copper_crystals() -> list:
    """24 copper crystals of different kinds, sizes and lattice constants (each at or near its minimum)."""
    out = []
    for a in np.linspace(3.55, 3.68, 6):
        out += [bulk("Cu", "fcc", a=a), bulk("Cu", "fcc", a=a, cubic=True), bulk("Cu", "fcc", a=a) * (2, 1, 1)]
    out += [bulk("Cu", "bcc", a=a) for a in (2.85, 2.88, 2.91)]
    out += [bulk("Cu", "hcp", a=a, c=1.633 * a) for a in (2.53, 2.56, 2.59)]
    return out


def _ase_fit(atoms, calculator, n_volumes=9, volume_range=0.1, eos="birchmurnaghan", fmax=None):
    """ASE alone: the same scaled cells, ASE's energies (relaxed by ASE's FIRE when fmax is given), ASE's fit."""
    volumes, energies = [], []
    for f in np.linspace(1 - volume_range, 1 + volume_range, n_volumes):
        scaled = atoms.copy()
        scaled.set_cell(atoms.cell * f ** (1 / 3), scale_atoms=True)
        scaled.calc = calculator()
        if fmax is not None:
            FIRE(scaled, logfile=None).run(fmax=fmax, steps=2000)
        volumes.append(scaled.get_volume())
        energies.append(scaled.get_potential_energy())
    fit = EquationOfState(volumes, energies, eos=eos)
    v0, e0, b0 = fit.fit(warn=False)
    return volumes, energies, v0, e0, b0, fit.eos_parameters[2]


@pytest.mark.parametrize("which", ["emt", "lj"])
def test_v0_and_b0_equal_ases_own_fit_for_a_batch_of_copper(which, request):
    pot = request.getfixturevalue(which)
    crystals = _copper_crystals()
    assert len(crystals) >= 20
    results = equation_of_state(crystals, pot.model, relax_positions=which == "emt")
    assert [r.structure for r in results] == list(range(len(crystals)))
    for r, atoms in zip(results, crystals, strict=True):
        volumes, energies, v0, e0, b0, b0_prime = _ase_fit(atoms, pot.calculator)
        assert r.error is None, r.error
        np.testing.assert_allclose(r.volumes, volumes, rtol=1e-12)
        np.testing.assert_allclose(r.energies, energies, rtol=1e-9, atol=1e-9)
        assert r.v0 == pytest.approx(v0, rel=1e-6)
        assert r.b0 == pytest.approx(b0, rel=1e-6)
        assert r.e0 == pytest.approx(e0, rel=1e-6)
        assert r.b0_prime == pytest.approx(b0_prime, rel=1e-5)
        assert r.b0_gpa == pytest.approx(b0 * 160.21766208, rel=1e-6)
    for k in range(0, 18, 3):  # primitive, cubic and 2x1x1 fcc cells of one lattice constant: one crystal
        prim, cubic, double = results[k : k + 3]
        assert cubic.v0 == pytest.approx(4 * prim.v0, rel=1e-6) and double.v0 == pytest.approx(2 * prim.v0, rel=1e-6)
        assert cubic.b0 == pytest.approx(prim.b0, rel=1e-6) and double.b0 == pytest.approx(prim.b0, rel=1e-6)


def test_relaxed_positions_give_ases_relaxed_fit(emt):
    """Rattled crystals: positions relaxed at each volume, as ASE's FIRE relaxes them."""
    crystals = [bulk("Cu", "fcc", a=3.6, cubic=True) * (2, 1, 1), bulk("Cu", "fcc", a=3.62, cubic=True)]
    for k, a in enumerate(crystals):
        a.rattle(0.05, seed=k)
    results = equation_of_state(crystals, emt.model, n_volumes=7, volume_range=0.06, fmax=1e-4, max_steps=3000)
    unrelaxed = equation_of_state(crystals, emt.model, n_volumes=7, volume_range=0.06, relax_positions=False)
    for r, u, atoms in zip(results, unrelaxed, crystals, strict=True):
        _, energies, v0, _, b0, _ = _ase_fit(atoms, emt.calculator, n_volumes=7, volume_range=0.06, fmax=1e-4)
        assert r.error is None and u.error is None
        np.testing.assert_allclose(r.energies, energies, atol=1e-6)
        assert r.v0 == pytest.approx(v0, rel=1e-4) and r.b0 == pytest.approx(b0, rel=1e-3)
        assert all(e < eu - 1e-3 for e, eu in zip(r.energies, u.energies, strict=True)), "relaxing lowers each energy"


def test_atomic_data_and_batches_give_the_same_results(lj):
    crystals = [bulk("Cu", "fcc", a=3.6), bulk("Cu", "bcc", a=2.88)]
    from_atoms = equation_of_state(crystals, lj.model, relax_positions=False)
    data = [AtomicData.from_atoms(a, dtype=torch.float64) for a in crystals]
    for given in (data, Batch.from_data_list(data)):
        for r, ref in zip(equation_of_state(given, lj.model, relax_positions=False), from_atoms, strict=True):
            assert r.v0 == pytest.approx(ref.v0, rel=1e-9) and r.b0 == pytest.approx(ref.b0, rel=1e-9)


def test_every_structure_comes_back_once_and_failures_say_why(emt):
    good = bulk("Cu", "fcc", a=3.6)
    molecule = good.copy()
    molecule.pbc = False
    overlapping = bulk("Cu", "fcc", a=3.6, cubic=True)
    overlapping.positions[1] = overlapping.positions[0] + 0.01
    rattled = bulk("Cu", "fcc", a=3.6, cubic=True)
    rattled.rattle(0.1, seed=3)
    squeezed = bulk("Cu", "fcc", a=3.0)  # its minimum lies far outside +-10 % of its volume
    results = equation_of_state([good, molecule, overlapping, rattled, squeezed], emt.model, max_steps=2)
    assert [r.structure for r in results] == [0, 1, 2, 3, 4]
    assert results[0].error is None and results[0].v0 is not None
    assert "periodic in 3 dimensions" in results[1].error and results[1].v0 is None
    assert "closer than" in results[2].error and np.isnan(results[2].energies).all()
    assert "did not relax" in results[3].error and "volume 0" in results[3].error
    assert "outside the volumes sampled" in results[4].error


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"eos": "bm"}, "unknown eos"), ({"n_volumes": 4}, "at least 5"), ({"volume_range": 1.0}, "volume_range"),
])
def test_bad_options_are_refused(lj, kwargs, match):
    with pytest.raises(ValueError, match=match):
        equation_of_state([bulk("Cu")], lj.model, **kwargs)
