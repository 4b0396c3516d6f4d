"""Rock-salt NaCl with its charges."""

from __future__ import annotations

import pytest
from ase.build import bulk

from alchemi_electrostatics.testing import NACL_LATTICE

pytest_plugins = ["alchemi_core.testing.fixtures"]


@pytest.fixture
def nacl():
    atoms = bulk("NaCl", "rocksalt", a=NACL_LATTICE, cubic=True)
    atoms.set_initial_charges([1.0 if z == 11 else -1.0 for z in atoms.numbers])
    return atoms
