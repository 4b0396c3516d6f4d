"""Fixtures: AIMNet2 networks with random weights saved as aimnet model files, and structures
for them (neutral and charged molecules of different sizes, a periodic box of water)."""

from __future__ import annotations

import pytest
import torch

pytest_plugins = ["alchemi_core.testing.fixtures"]


@pytest.fixture(scope="session")
def model_path(tmp_path_factory):
    """The released wB97M-D3 architecture with random weights (seed 0), as ``aimnet export`` saves it."""
    from alchemi_aimnet.random_model import random_aimnet2_file

    return random_aimnet2_file(tmp_path_factory.mktemp("aimnet") / "random.pt", seed=0)


@pytest.fixture(scope="session")
def aimnet2(model_path):
    from alchemi_aimnet import AIMNet2Model

    return AIMNet2Model(model_path)


@pytest.fixture
def molecules():
    """Water (neutral), methane cation (doublet), ethanol anion (doublet), benzene (neutral)."""
    from ase.build import molecule

    out = []
    for seed, (name, charge, spin) in enumerate((("H2O", 0, 1), ("CH4", 1, 2), ("CH3CH2OH", -1, 2), ("C6H6", 0, 1))):
        atoms = molecule(name)
        atoms.rattle(0.03, seed=seed)  # off the symmetric geometry, so no force vanishes by symmetry
        atoms.info.update(charge=charge, spin=spin)
        out.append(atoms)
    return out


@pytest.fixture
def water_box():
    """Two water molecules in a periodic, slightly sheared box."""
    from ase.build import molecule

    atoms = molecule("H2O")
    atoms.center(vacuum=2.5)
    atoms = atoms.repeat((2, 1, 1))
    atoms.cell[1, 0] += 0.3
    atoms.pbc = True
    atoms.rattle(0.03, seed=7)
    atoms.info.update(charge=0, spin=1)
    return atoms


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
