"""StageTimingHook: every phase of the step is timed; the slow part shows up where it is."""

from __future__ import annotations

import io
import time

import torch

from alchemi_core.dynamics import DemoDynamics, FusedStage
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_hooks.timing import PHASES, StageTimingHook


class SlowModel(DemoModelWrapper):
    def forward(self, batch, compute_stress=False):
        time.sleep(0.003)
        return super().forward(batch)


class SlowPostUpdate(DemoDynamics):
    def post_update(self, batch):
        time.sleep(0.002)
        super().post_update(batch)


def test_summary_covers_every_phase_and_finds_the_slow_one(molecules):
    out = io.StringIO()
    hook = StageTimingHook(file=out)
    SlowPostUpdate(model=SlowModel(), n_steps=20, dt=0.5, hooks=[hook]).run(molecules([3, 4]))
    s = hook.summary()
    assert s["steps"] == 20 and s["device"] == "cpu"
    phases = s["phases"]
    assert set(phases) == set(PHASES)
    assert phases["compute"]["intervals"] == 20 and phases["pre_update"]["intervals"] == 20
    assert phases["checks"]["intervals"] == 19  # between consecutive steps
    assert phases["compute"]["per_step_ms"] >= 3.0
    assert 2.0 <= phases["post_update"]["per_step_ms"] < phases["compute"]["per_step_ms"]
    assert phases["compute"]["share"] > 0.5
    assert abs(sum(p["share"] for p in phases.values()) - 1.0) < 1e-9
    assert sum(p["total_s"] for p in phases.values()) <= s["wall_s"]
    table = out.getvalue()
    assert "StageTimingHook: 20 steps" in table
    for phase in PHASES:
        assert phase in table


def test_each_sub_stage_update_is_timed_in_a_fused_stage(molecules):
    batch = molecules([3, 4])
    batch.set_field("status", torch.tensor([0, 1]), "system")
    hook = StageTimingHook(report=False)
    opt = DemoDynamics(model=DemoModelWrapper(), n_steps=5, dt=0.5, hooks=[hook])
    md = DemoDynamics(model=DemoModelWrapper(), n_steps=5, dt=0.5)
    FusedStage([(0, opt), (1, md)]).run(batch)
    phases = hook.summary()["phases"]
    steps = hook.summary()["steps"]
    # A sub-stage's hook marks that stage's own updates: once per step.
    assert phases["pre_update"]["intervals"] == steps
    assert phases["post_update"]["intervals"] == steps
    assert phases["compute"]["intervals"] == steps


def test_every_other_step_is_timed_with_frequency_two(molecules):
    hook = StageTimingHook(frequency=2, report=False)
    DemoDynamics(model=DemoModelWrapper(), n_steps=10, dt=0.5, hooks=[hook]).run(molecules([3]))
    s = hook.summary()
    assert s["steps"] == 5
    assert s["phases"]["compute"]["intervals"] == 5 and s["phases"]["checks"]["intervals"] == 0
