"""An integrator driven by ``step()`` alone is freed by reference counting when dropped, its
batch with it: the engine keeps no build function of the values it derived from the masks (each
closes over the integrator) unless it must rebuild them in place itself (a captured step, masks
rewritten in the step), and a run's end drops those values."""

from __future__ import annotations

import pytest
from integrators_testkit.lj_reference import ReferenceLJ, argon

from alchemi_core.data import Batch
from alchemi_core.testing.lifetime import collector_off, still_alive, watch
from alchemi_core.tuning import CoreTuning
from alchemi_integrators import (
    CSVR,
    FIRE,
    FIRE2,
    NPH,
    NPTMTK,
    Langevin,
    NoseHooverChain,
    NPTCRescale,
    VelocityVerlet,
)

STAGES = {
    "langevin": lambda m: Langevin(m, dt=2.0, temperature=50.0, friction=0.01),
    "fire": lambda m: FIRE(m, dt=1.0),
    "velocity-verlet": lambda m: VelocityVerlet(m, dt=2.0),
    "nose-hoover": lambda m: NoseHooverChain(m, dt=2.0, temperature=50.0),
    "csvr": lambda m: CSVR(m, dt=2.0, temperature=50.0, tau=50.0),
    "fire2": lambda m: FIRE2(m, dt=1.0),
    "npt-mtk": lambda m: NPTMTK(m, dt=2.0, temperature=50.0, pressure=0.0),
    "npt-crescale": lambda m: NPTCRescale(m, dt=2.0, temperature=50.0, pressure=0.0),
    "nph": lambda m: NPH(m, dt=2.0, temperature=50.0, pressure=0.0),
}


def _stepped_and_dropped(name: str, device: str) -> None:
    with collector_off():
        batch = Batch.from_data_list([argon(2, rattle=0.05, seed=s) for s in range(3)]).to(device)
        stage = STAGES[name](ReferenceLJ())
        for _ in range(4):
            stage.step(batch)
        assert stage.context._derived  # it did derive values
        assert all(build is None for _, build, _ in stage.context._derived.values())
        refs = watch(stage, batch)
        del stage, batch
        assert still_alive(refs) == []


@pytest.mark.parametrize("name", sorted(STAGES))
def test_a_stage_driven_by_step_alone_is_freed_with_its_batch(name):
    _stepped_and_dropped(name, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["langevin-warp", "fire", "npt-mtk", "npt-crescale"])
def test_a_stage_driven_by_step_alone_on_a_gpu_is_freed_with_its_batch(name):
    """(On a GPU the masks are rewritten in the step only where the step is captured.)"""
    _stepped_and_dropped(name, "cuda")


def test_a_run_that_rewrites_masks_in_its_steps_keeps_the_builds():
    """There the engine rebuilds the values in place each step; the run's end drops them."""
    with collector_off():
        batch = Batch.from_data_list([argon(2, rattle=0.05, seed=s) for s in range(3)])
        fire = FIRE(ReferenceLJ(), dt=1.0, tuning=CoreTuning(run_ahead=False, masks_in_step=True, force_max_kernel=True))
        fire.step(batch)
        assert fire.context._derived
        assert all(build is not None for _, build, _ in fire.context._derived.values())
        fire.run(batch, n_steps=3)
        assert not fire.context._derived
        refs = watch(fire, batch)
        del fire, batch
        assert still_alive(refs) == []
