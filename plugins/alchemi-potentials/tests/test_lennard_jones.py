"""Lennard-Jones against ASE, an independent numpy reference and finite differences."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.calculators.lj import LennardJones as AseLennardJones

from alchemi_core import registry
from alchemi_potentials import LennardJones
from alchemi_potentials.neighbors import BatchedNeighborList

EPS, SIG, RC = 0.0104, 3.405, 8.5125


def structures(ref, rng):
    """Periodic and partly periodic systems covering the neighbour list's cases."""
    small_fcc = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(2)  # 10.5 Å: smaller than 2 cutoffs
    small_fcc.rattle(0.15, seed=3)
    tiny = ref.atoms(rng, 3, ref.cell(rng, (5.0, 5.5, 6.0), 0.2), True, min_distance=2.8)  # cell < cutoff
    triclinic = ref.atoms(rng, 20, ref.cell(rng, (11.0, 12.0, 10.0), 0.35), True)
    slab = ref.atoms(rng, 14, ref.cell(rng, (9.0, 10.0, 14.0), 0.2), (True, True, False))
    slab.positions[:4, 2] += 9.0  # beyond the cell along the open axis
    wire = ref.atoms(rng, 10, ref.cell(rng, (13.0, 13.0, 7.0), 0.0), (False, False, True))
    cluster = ref.atoms(rng, 12, np.diag([9.0, 9.0, 9.0]), False)
    outside = ref.atoms(rng, 12, ref.cell(rng, (10.0, 10.5, 11.0), 0.25), True, outside=3)
    left = ref.atoms(rng, 12, ref.cell(rng, (10.0, 10.5, 11.0), 0.2), True)
    left.set_cell(left.cell.array[[1, 0, 2]], scale_atoms=False)  # swapped rows: det < 0
    return {
        "small_fcc": small_fcc, "tiny": tiny, "triclinic": triclinic, "slab": slab, "wire": wire,
        "cluster": cluster, "outside": outside, "left_handed": left,
    }


def ase_results(atoms, calc):
    a = atoms.copy()
    a.calc = calc
    return a.get_potential_energy(), a.get_forces(), a.get_stress(voigt=False)



@pytest.mark.parametrize("half", [True, False], ids=["half-list", "full-list"])
def test_matches_ase_in_one_batch(ref, rng, half, tuning):
    """Shifted LJ equals ASE's LennardJones (which shifts) for every system of one batch."""
    systems = structures(ref, rng)
    model = LennardJones(EPS, SIG, RC, shift_energy=True, tuning=tuning,
                         neighbor_list=BatchedNeighborList(RC, 0.5, half_list=half, tuning=tuning))
    batch = ref.batch(list(systems.values()))
    out = model(batch, compute_stress=True)
    calc = AseLennardJones(epsilon=EPS, sigma=SIG, rc=RC, smooth=False)
    ptr = np.concatenate(([0], np.cumsum(batch.num_nodes_per_system)))
    for s, (name, atoms) in enumerate(systems.items()):
        e, f, st = ase_results(atoms, calc)
        assert abs(out["energy"][s, 0].item() - e) <= 1e-6 * abs(e), name
        ref.close(out["forces"][ptr[s] : ptr[s + 1]], f, what=f"{name} forces")
        ref.close(out["stress"][s], st, what=f"{name} stress")
        assert np.abs(f).max() > 1e-3, f"{name} has no forces to compare"


def test_unshifted_matches_numpy_reference(ref, rng, tuning):
    systems = structures(ref, rng)
    model = LennardJones(EPS, SIG, RC, tuning=tuning)
    batch = ref.batch(list(systems.values()))
    out = model(batch, compute_stress=True)
    pair = ref.lennard_jones(lambda a, b: EPS, lambda a, b: SIG, RC, shift=False)
    ptr = np.concatenate(([0], np.cumsum(batch.num_nodes_per_system)))
    for s, (name, atoms) in enumerate(systems.items()):
        e, f, w = ref.pairs(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc, RC, pair)
        assert abs(out["energy"][s, 0].item() - e) <= 1e-6 * abs(e), name
        ref.close(out["forces"][ptr[s] : ptr[s + 1]], f, what=name)
        ref.close(out["stress"][s], w / abs(np.linalg.det(atoms.cell.array)), what=f"{name} stress")


def test_mixed_species_lorentz_berthelot_and_pair_override(ref, rng, tuning):
    eps = {18: 0.0104, 36: 0.0141, 10: 0.0031}
    sig = {18: 3.405, 36: 3.65, 10: 2.75}
    override = {(36, 18): 0.02}
    model = LennardJones(eps, sig, 9.0, pair_epsilon=override, tuning=tuning)
    systems = [ref.atoms(rng, 18, ref.cell(rng, (11.0, 12.0, 10.5), 0.3), True, species=(10, 18, 36), min_distance=2.5),
               ref.atoms(rng, 10, ref.cell(rng, (9.0, 9.5, 12.0), 0.2), (True, False, True), species=(18, 36))]

    def e_of(a, b):
        pair_eps = np.sqrt(np.vectorize(eps.get)(a) * np.vectorize(eps.get)(b))
        swap = ((a == 18) & (b == 36)) | ((a == 36) & (b == 18))
        return np.where(swap, 0.02, pair_eps)

    def s_of(a, b):
        return 0.5 * (np.vectorize(sig.get)(a) + np.vectorize(sig.get)(b))

    pair = ref.lennard_jones(e_of, s_of, 9.0, shift=False)
    batch = ref.batch(systems)
    out = model(batch)
    ptr = np.concatenate(([0], np.cumsum(batch.num_nodes_per_system)))
    for s, atoms in enumerate(systems):
        e, f, _ = ref.pairs(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc, 9.0, pair)
        assert abs(out["energy"][s, 0].item() - e) <= 1e-6 * abs(e)
        ref.close(out["forces"][ptr[s] : ptr[s + 1]], f)
    # Geometric mixing changes the Ne-Ar sigma, so the energy must change too.
    geo = LennardJones(eps, sig, 9.0, pair_epsilon=override, mixing="geometric", tuning=tuning)(batch)
    assert not torch.allclose(geo["energy"], out["energy"])


def test_forces_and_stress_are_derivatives_of_the_energy(ref, rng, tuning):
    atoms = ref.atoms(rng, 16, ref.cell(rng, (10.0, 11.0, 10.5), 0.3), True)
    model = LennardJones(EPS, SIG, RC, shift_energy=True, tuning=tuning)

    def energy(positions, cell):
        a = atoms.copy()
        a.set_cell(cell, scale_atoms=False)
        a.positions = positions
        return model(ref.batch([a]))["energy"].item()

    out = model(ref.batch([atoms]), compute_stress=True)
    h = 1e-5
    x0, c0 = atoms.positions.copy(), atoms.cell.array.copy()
    for i, k in [(0, 0), (3, 1), (7, 2), (11, 0)]:
        xp, xm = x0.copy(), x0.copy()
        xp[i, k] += h
        xm[i, k] -= h
        fd = -(energy(xp, c0) - energy(xm, c0)) / (2 * h)
        assert abs(out["forces"][i, k].item() - fd) < 1e-6 * np.abs(out["forces"].numpy()).max()
    # Stress = (1/V) dE/d(strain): deform cell and atoms by (1 + e) and differentiate.
    volume = abs(np.linalg.det(c0))
    for a, b in [(0, 0), (1, 2), (2, 2)]:
        eps = np.zeros((3, 3))
        eps[a, b] = eps[b, a] = h
        up, down = np.eye(3) + eps, np.eye(3) - eps
        de = energy(x0 @ up, c0 @ up) - energy(x0 @ down, c0 @ down)
        fd = de / (2 * h) / volume / (1 if a == b else 2)
        assert abs(out["stress"][0, a, b].item() - fd) < 1e-6 * np.abs(out["stress"].numpy()).max()


def test_float32_agrees_with_float64(ref, rng, tuning):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3)
    atoms.rattle(0.1, seed=5)
    out64 = LennardJones(EPS, SIG, RC, tuning=tuning)(ref.batch([atoms], dtype=torch.float64), compute_stress=True)
    out32 = LennardJones(EPS, SIG, RC, tuning=tuning)(ref.batch([atoms], dtype=torch.float32), compute_stress=True)
    assert out32["forces"].dtype == torch.float32 and out32["energy"].dtype == torch.float32
    ref.close(out32["energy"], out64["energy"], rtol=1e-5)
    ref.close(out32["forces"], out64["forces"], rtol=1e-4)
    ref.close(out32["stress"], out64["stress"], rtol=1e-4)


def test_switch_makes_energy_and_forces_continuous_at_the_cutoff(ref, tuning):
    import ase

    onset = 7.0
    model = LennardJones(EPS, SIG, RC, switch_onset=onset, tuning=tuning)
    rs = [onset - 1e-3, onset + 1e-3, RC - 1e-3, RC + 1e-3, 6.0]
    dimers = [ase.Atoms("Ar2", positions=[[0, 0, 0], [r, 0, 0]], cell=np.eye(3) * 40, pbc=False) for r in rs]
    out = model(ref.batch(dimers))
    e = out["energy"][:, 0].numpy()
    fx = out["forces"][1::2, 0].numpy()
    plain = 4 * EPS * ((SIG / 6.0) ** 12 - (SIG / 6.0) ** 6)
    assert e[4] == pytest.approx(plain, rel=1e-12)  # below the onset: plain LJ
    assert abs(e[0] - e[1]) < 1e-6 and abs(fx[0] - fx[1]) < 1e-6
    assert abs(e[2]) < 1e-10 and abs(fx[2]) < 1e-8 and e[3] == 0.0 and fx[3] == 0.0


def test_registry_builds_the_w1_model(ref):
    model = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5125)
    assert isinstance(model, LennardJones) and model.card.species is None
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3)
    out = model(ref.batch([atoms], dtype=torch.float32))
    # A perfect crystal: no net force on any atom, and the lattice sum of the reference.
    assert out["forces"].abs().max().item() < 1e-5
    pair = ref.lennard_jones(lambda a, b: EPS, lambda a, b: SIG, RC, shift=False)
    e, _, _ = ref.pairs(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc, RC, pair)
    assert out["energy"].item() == pytest.approx(e, rel=1e-5)
    assert -0.09 < e / len(atoms) < -0.07  # argon's cohesive energy is about 0.08 eV/atom
