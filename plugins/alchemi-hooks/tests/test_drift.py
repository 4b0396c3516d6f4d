"""EnergyDriftMonitorHook: quiet on a good time step, fires on a bad one, follows systems."""

from __future__ import annotations

import warnings

import pytest
import torch

from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import DemoDynamics, FusedStage, SizeAwareSampler
from alchemi_core.errors import ConfigurationError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_hooks.drift import EnergyDriftMonitorHook, follow_by_id
from alchemi_hooks.errors import EnergyDriftError, EnergyDriftWarning

THRESHOLD = 1e-4  # eV/atom; velocity Verlet at 0.25 fs drifts ~1e-6 here, at 6 fs ~1e-3


def run_md(batch, dt, hook, steps=200):
    DemoDynamics(model=DemoModelWrapper(), n_steps=steps, dt=dt, hooks=[hook]).run(batch)


def test_quiet_on_a_good_time_step(molecules):
    hook = EnergyDriftMonitorHook(threshold=THRESHOLD, frequency=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_md(molecules([3, 4, 5, 6], speed=0.05), dt=0.25, hook=hook)
    assert hook.flagged == {}


def test_warns_once_per_system_on_a_bad_time_step(molecules):
    hook = EnergyDriftMonitorHook(threshold=THRESHOLD, frequency=10)
    with pytest.warns(EnergyDriftWarning, match="system_id") as caught:
        run_md(molecules([3, 4, 5, 6], speed=0.05), dt=6.0, hook=hook)
    assert set(hook.flagged) == {0, 1, 2, 3}
    assert all(v > THRESHOLD for v in hook.flagged.values())
    named = [sid for w in caught for sid in range(4) if f"system_id {sid}:" in str(w.message)]
    assert sorted(named) == [0, 1, 2, 3]  # each system in exactly one warning


def test_raises_with_the_drifts_when_asked(molecules):
    hook = EnergyDriftMonitorHook(threshold=THRESHOLD, frequency=10, action="raise")
    with pytest.raises(EnergyDriftError) as info:
        run_md(molecules([3, 4, 5, 6], speed=0.05), dt=6.0, hook=hook)
    assert info.value.drifts and all(v > THRESHOLD for v in info.value.drifts.values())
    assert "dt = 6.0 fs" in str(info.value)


def test_references_follow_systems_through_inflight_refill(molecule):
    """Systems leave and enter mid-run; a reference mixed up between systems would fire."""
    data = [molecule(n, seed=i, speed=0.05) for i, n in enumerate([3, 6, 4, 5, 3, 6, 4, 5])]
    sampler = SizeAwareSampler(ListDataset(data), max_atoms=14, max_batch_size=3, bin_width=1)
    hook = EnergyDriftMonitorHook(threshold=THRESHOLD, frequency=5, action="raise")
    DemoDynamics(model=DemoModelWrapper(), n_steps=40, dt=0.25, sampler=sampler, refill_frequency=5, hooks=[hook]).run()
    assert hook.flagged == {}


def test_reference_is_taken_when_a_system_enters_the_md_stage(molecules):
    """The optimiser's stage does not conserve energy (friction); the MD stage must not blame it."""
    batch = molecules([3, 4, 5], speed=0.05)
    batch.set_field("status", torch.tensor([0, 1, 0]), "system")

    class Friction:
        stage = EnergyDriftMonitorHook.stage
        frequency = 1

        def __call__(self, b, d):
            b.velocities.mul_(torch.where(d.context.system_mask, 0.5, 1.0).index_select(0, b.batch_idx).unsqueeze(-1))

    opt = DemoDynamics(model=DemoModelWrapper(), n_steps=20, dt=0.25, hooks=[Friction()])
    hook = EnergyDriftMonitorHook(threshold=THRESHOLD, frequency=5, action="raise")
    md = DemoDynamics(model=DemoModelWrapper(), n_steps=40, dt=0.25, hooks=[hook])
    out = FusedStage([(0, opt), (1, md)]).run(batch)
    assert (out.status == 2).all() and hook.flagged == {}


def test_follow_by_id_carries_values_across_a_reordering():
    old_ids = torch.tensor([4, 9, 2, 7])
    values = torch.tensor([40.0, 90.0, 20.0, 70.0])
    valid = torch.tensor([True, True, False, True])
    got, ok = follow_by_id(old_ids, values, valid, torch.tensor([7, 2, 5, 4]))
    assert ok.tolist() == [True, False, False, True]
    assert got[ok].tolist() == [70.0, 40.0]


@pytest.mark.parametrize("kwargs", [{"threshold": 0.0}, {"threshold": float("nan")}, {"action": "ignore"}])
def test_rejects_bad_settings(kwargs):
    with pytest.raises(ConfigurationError):
        EnergyDriftMonitorHook(**kwargs)
