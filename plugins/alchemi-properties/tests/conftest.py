"""Shared models for the alchemi-properties tests: EMT copper and Tersoff silicon through
``model:ase``, Lennard-Jones copper through ``model:lennard-jones``, each with the factory of the
ASE calculator that computes the same thing, so every reference is computed by ASE itself."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from alchemi_core import registry

pytest_plugins = ["alchemi_core.testing.fixtures"]

#: Lennard-Jones copper (eV, Å), energy shifted to zero at the cutoff as ASE's LennardJones does.
LJ_CU = {"epsilon": 0.4093, "sigma": 2.338, "cutoff": 5.5}
#: Tersoff's silicon, Phys. Rev. B 37, 6991 (1988), as ASE's own tests write it.
TERSOFF_SI = {
    "A": 3264.7, "B": 95.373, "lambda1": 3.2394, "lambda2": 1.3258, "lambda3": 1.3258, "beta": 0.33675,
    "gamma": 1.0, "m": 3.0, "n": 22.956, "c": 4.8381, "d": 2.0417, "h": 0.0, "R": 3.0, "D": 0.2,
}


def _emt():
    from ase.calculators.emt import EMT

    return EMT()


def _tersoff():
    from ase.calculators.tersoff import Tersoff, TersoffParameters

    return Tersoff({("Si", "Si", "Si"): TersoffParameters(**TERSOFF_SI)})


def _ase_lj():
    from ase.calculators.lj import LennardJones

    return LennardJones(epsilon=LJ_CU["epsilon"], sigma=LJ_CU["sigma"], rc=LJ_CU["cutoff"], smooth=False)


@pytest.fixture
def emt():
    """EMT: ``.model`` (model:ase) and ``.calculator`` (a factory of ASE calculators)."""
    return SimpleNamespace(model=registry.build("model:ase", calculator_or_factory=_emt), calculator=_emt)


@pytest.fixture
def tersoff():
    """Tersoff silicon: ``.model`` (model:ase) and ``.calculator``."""
    return SimpleNamespace(model=registry.build("model:ase", calculator_or_factory=_tersoff), calculator=_tersoff)


@pytest.fixture
def lj():
    """Lennard-Jones copper: ``.model`` (model:lennard-jones) and ``.calculator`` (ASE's LennardJones)."""
    return SimpleNamespace(model=registry.build("model:lennard-jones", shift_energy=True, **LJ_CU), calculator=_ase_lj)
