"""Morse against ASE's MorsePotential (same smooth cutoff) and the numpy reference."""

from __future__ import annotations

import numpy as np
import torch
from ase.calculators.morse import MorsePotential

from alchemi_core import registry
from alchemi_potentials import Morse

D, RHO0, R0, RCUT1, RCUT2 = 0.35, 4.0, 2.9, 1.9, 2.7  # ASE's parameters; cutoff 7.83 Å



def systems(ref, rng):
    return [
        ref.atoms(rng, 20, ref.cell(rng, (9.0, 10.0, 9.5), 0.3), True, min_distance=2.4),
        ref.atoms(rng, 6, ref.cell(rng, (5.0, 6.0, 5.5), 0.2), True, min_distance=2.4),  # cell < cutoff
        ref.atoms(rng, 12, ref.cell(rng, (9.0, 9.0, 13.0), 0.2), (True, False, True), min_distance=2.4),
        ref.atoms(rng, 10, np.diag([10.0, 10.0, 10.0]), False, min_distance=2.4),
    ]


def test_matches_ase_morse_with_its_smooth_cutoff(ref, rng, tuning):
    atoms_list = systems(ref, rng)
    model = Morse(D=D, alpha=RHO0 / R0, r0=R0, cutoff=RCUT2 * R0, switch_onset=RCUT1 * R0, tuning=tuning)
    batch = ref.batch(atoms_list)
    out = model(batch, compute_stress=True)
    ptr = np.concatenate(([0], np.cumsum(batch.num_nodes_per_system)))
    for s, atoms in enumerate(atoms_list):
        a = atoms.copy()
        a.calc = MorsePotential(epsilon=D, rho0=RHO0, r0=R0, rcut1=RCUT1, rcut2=RCUT2)
        e = a.get_potential_energy()
        assert abs(out["energy"][s, 0].item() - e) <= 1e-6 * abs(e)
        ref.close(out["forces"][ptr[s] : ptr[s + 1]], a.get_forces(), what=f"system {s} forces")
        ref.close(out["stress"][s], a.get_stress(voigt=False), what=f"system {s} stress")


def test_hard_and_shifted_cutoffs_match_numpy_reference(ref, rng, tuning):
    atoms_list = systems(ref, rng)
    batch = ref.batch(atoms_list)
    cutoff = 7.0
    for shift in (False, True):
        out = Morse(D=D, alpha=1.3, r0=R0, cutoff=cutoff, shift_energy=shift, tuning=tuning)(batch)
        pair = ref.morse(lambda a, b: D, lambda a, b: 1.3, lambda a, b: R0, cutoff, shift)
        ptr = np.concatenate(([0], np.cumsum(batch.num_nodes_per_system)))
        for s, atoms in enumerate(atoms_list):
            e, f, _ = ref.pairs(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc, cutoff, pair)
            assert abs(out["energy"][s, 0].item() - e) <= 1e-6 * abs(e)
            ref.close(out["forces"][ptr[s] : ptr[s + 1]], f)


def test_per_species_tables_with_override(ref, rng, tuning):
    depth, alpha, r0 = {29: 0.34, 47: 0.32}, {29: 1.36, 47: 1.37}, {29: 2.87, 47: 3.1}
    model = Morse(D=depth, alpha=alpha, r0=r0, cutoff=8.0, pair_r0={(29, 47): 2.95}, tuning=tuning)
    atoms = ref.atoms(rng, 16, ref.cell(rng, (9.0, 10.0, 9.5), 0.3), True, species=(29, 47), min_distance=2.4)
    out = model(ref.batch([atoms]))

    def look(table):
        return lambda a, b: (np.vectorize(table.get)(a), np.vectorize(table.get)(b))

    def d_of(a, b):
        x, y = look(depth)(a, b)
        return np.sqrt(x * y)

    def a_of(a, b):
        x, y = look(alpha)(a, b)
        return 0.5 * (x + y)

    def r_of(a, b):
        x, y = look(r0)(a, b)
        return np.where(a != b, 2.95, 0.5 * (x + y))

    e, f, _ = ref.pairs(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc, 8.0,
                        ref.morse(d_of, a_of, r_of, 8.0, False))
    assert abs(out["energy"].item() - e) <= 1e-6 * abs(e)
    ref.close(out["forces"], f)


def test_registry_builds_morse_in_float32(ref, rng, tuning):
    model = registry.build("model:morse", D=D, alpha=1.3, r0=R0, cutoff=7.0)
    atoms = systems(ref, rng)[0]
    out32 = model(ref.batch([atoms], dtype=torch.float32))
    out64 = Morse(D=D, alpha=1.3, r0=R0, cutoff=7.0, tuning=tuning)(ref.batch([atoms]))
    ref.close(out32["forces"], out64["forces"], rtol=1e-4)
    ref.close(out32["energy"], out64["energy"], rtol=1e-5)
