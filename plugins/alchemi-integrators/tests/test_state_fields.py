"""Each integrator registers the batch fields it keeps for itself (``state_fields``), and these are
exactly the fields a run of it creates beyond the structure's data: so ``to_atoms`` and exports,
which leave registered state out, never hand an optimiser's ``fire_dt`` to a user (issue 59,
finding 10), and a new state field cannot be forgotten."""

from __future__ import annotations

import pytest
from integrators_testkit.lj_reference import ReferenceLJ, argon

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.data.fields import ENGINE_STATE_FIELDS
from alchemi_integrators import (
    BFGS,
    CSVR,
    FIRE,
    FIRE2,
    LBFGS,
    NPH,
    NPTMTK,
    Langevin,
    NoseHooverChain,
    NPTCRescale,
    VelocityVerlet,
)
from alchemi_integrators.plugin import STATE_FIELDS

STAGES = {
    "velocity-verlet": lambda m: VelocityVerlet(m, dt=2.0),
    "langevin": lambda m: Langevin(m, dt=2.0, temperature=50.0, friction=0.01),
    "nose-hoover": lambda m: NoseHooverChain(m, dt=2.0, temperature=50.0),
    "csvr": lambda m: CSVR(m, dt=2.0, temperature=50.0, tau=50.0),
    "fire": lambda m: FIRE(m, dt=1.0, cell_filter="frechet"),
    "fire2": lambda m: FIRE2(m, dt=1.0, cell_filter="unit"),
    "lbfgs": lambda m: LBFGS(m, cell_filter="frechet"),
    "bfgs": lambda m: BFGS(m, cell_filter="unit"),
    "npt-mtk": lambda m: NPTMTK(m, dt=2.0, temperature=50.0, pressure=0.0),
    "npt-crescale": lambda m: NPTCRescale(m, dt=2.0, temperature=50.0, pressure=0.0),
    "nph": lambda m: NPH(m, dt=2.0, temperature=50.0, pressure=0.0),
}
#: Fields a run creates that are data about the structure (forces, the cell filter's ASE-style
#: fmax) or the engine's columns users read (``status``, ``fmax``).
DATA = {"system_id", "velocities", "forces", "energy", "stress", "virial", "status", "fmax", "energy_change", "cell_filter_fmax"}


def test_every_registered_integrator_declares_its_state():
    ours = [r for r in registry.available("integrator") if r.target.startswith("alchemi_integrators.")]
    assert set(STAGES) == set(STATE_FIELDS) == {r.name for r in ours}
    assert all(r.state_fields == STATE_FIELDS[r.name] for r in ours)


@pytest.mark.parametrize("name", sorted(STAGES))
def test_the_declared_state_is_what_a_run_creates(name):
    batch = Batch.from_data_list([argon(2, rattle=0.05, seed=s) for s in range(2)])
    before = set(batch.keys())
    out = STAGES[name](ReferenceLJ()).run(batch, n_steps=3)
    created = set(out.keys()) - before - DATA - ENGINE_STATE_FIELDS
    assert created == set(STATE_FIELDS[name]), name
    assert set(STATE_FIELDS[name]) <= registry.engine_state_fields()
    info = out.to_atoms()[0].info
    assert not set(info) & registry.engine_state_fields(), sorted(info)
    assert {"status", "system_id", "fmax"} & set(info) == {"status", "system_id", "fmax"} & set(out.keys())
