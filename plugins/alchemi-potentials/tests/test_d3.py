"""model:d3 against the D3 program itself (simple-dftd3's ``dftd3`` package), and model:sum."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_potentials.testing import reference_structures

pytest.importorskip("torch_dftd")
dftd3 = pytest.importorskip("dftd3.interface")

BOHR = 0.52917726
HARTREE = 27.21138505
# Small cutoffs keep the edge lists of a CPU test small; the reference gets the same ones.
CUTOFF, CN_CUTOFF = 12.0, 8.0


def reference(atoms):
    """Energy (eV) and forces (eV/Å) of PBE-D3(BJ), two-body only, from the D3 program."""
    periodic = np.asarray(atoms.pbc, dtype=bool)
    lattice = atoms.cell.array / BOHR if periodic.any() else None
    model = dftd3.DispersionModel(atoms.numbers, atoms.positions / BOHR, lattice, periodic if periodic.any() else None)
    model.set_realspace_cutoff(CUTOFF / BOHR, CN_CUTOFF / BOHR, CN_CUTOFF / BOHR)
    param = dftd3.RationalDampingParam(s6=1.0, s8=0.7875, a1=0.4289, a2=4.4407, s9=0.0)
    res = model.get_dispersion(param, grad=True)
    return res["energy"] * HARTREE, -res["gradient"] * HARTREE / BOHR


def test_d3_bj_equals_the_d3_program():
    structures = reference_structures()
    model = registry.build("model:d3", functional="pbe", damping="bj", cutoff=CUTOFF, cn_cutoff=CN_CUTOFF)
    assert model.params["rs6"] == pytest.approx(0.4289) and model.params["rs18"] == pytest.approx(4.4407)
    batch = Batch.from_atoms(structures, dtype=torch.float64)
    out = model(batch, compute_stress=True)
    ptr = np.concatenate(([0], np.cumsum(batch.num_nodes_per_system)))
    for s, atoms in enumerate(structures):
        e, f = reference(atoms)
        assert abs(float(out["energy"][s, 0]) - e) < 1e-5, (s, float(out["energy"][s, 0]), e)
        np.testing.assert_allclose(out["forces"][ptr[s]:ptr[s + 1]].numpy(), f, atol=1e-6)
    alone = model(Batch.from_atoms(structures[1:2], dtype=torch.float64))
    assert abs(float(alone["energy"][0, 0] - out["energy"][1, 0])) < 1e-10


def test_stress_is_the_strain_derivative():
    """Stress against a finite difference of the energy under a small strain."""
    atoms = reference_structures()[1]
    model = registry.build("model:d3", cutoff=CUTOFF, cn_cutoff=CN_CUTOFF)
    stress = model(Batch.from_atoms([atoms], dtype=torch.float64), compute_stress=True)["stress"][0].numpy()
    h = 1e-5
    for a, b in [(0, 0), (1, 2)]:
        energies = []
        for sign in (1, -1):
            eps = np.zeros((3, 3))
            eps[a, b] = eps[b, a] = sign * h / (1 if a == b else 2)
            x = atoms.copy()
            x.set_cell(atoms.cell.array @ (np.eye(3) + eps), scale_atoms=True)
            energies.append(float(model(Batch.from_atoms([x], dtype=torch.float64))["energy"][0, 0]))
        fd = (energies[0] - energies[1]) / (2 * h) / atoms.get_volume()
        assert stress[a, b] == pytest.approx(fd, abs=1e-7)


def test_sum_adds_its_parts():
    structures = reference_structures()[:2]
    batch = Batch.from_atoms(structures, dtype=torch.float64)
    lj = {"component": "model:lennard-jones", "epsilon": 0.01, "sigma": 2.3, "cutoff": 6.0}
    d3 = {"component": "model:d3", "cutoff": CUTOFF, "cn_cutoff": CN_CUTOFF}
    total = registry.build("model:sum", parts=[lj, d3])
    assert total.card.cutoff == CUTOFF and total.cuda_graphs is False
    out = total(batch, compute_stress=True)
    parts = [registry.build(p.pop("component"), **p)(batch, compute_stress=True) for p in (dict(lj), dict(d3))]
    for key in ("energy", "forces", "stress"):
        shape = out[key].shape
        torch.testing.assert_close(out[key], parts[0][key].reshape(shape) + parts[1][key].reshape(shape))
