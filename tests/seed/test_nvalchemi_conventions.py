"""Code written for nvalchemi's version of the seed API works (finding 8 of issue 13)."""

from __future__ import annotations

import torch

from alchemi_core.dynamics import ConvergenceHook, DemoDynamics, DynamicsStage, FusedStage, Hook
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import make_batch


class Calls(Hook):
    def __init__(self, stage):
        super().__init__(frequency=1, stage=stage)
        self.steps: list[int] = []

    def __call__(self, batch, dynamics):
        self.steps.append(dynamics.step_count)


class CountingModel(DemoModelWrapper):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, batch, compute_stress=False):
        self.calls += 1
        return super().forward(batch, compute_stress)


def test_status_and_fmax_given_as_b_by_1_run_and_come_back_in_that_shape():
    model = DemoModelWrapper()
    batch = make_batch([3, 4], dtype=torch.float64)
    batch.status = torch.zeros(2, 1, dtype=torch.long)
    batch.fmax = torch.full((2, 1), float("inf"), dtype=torch.float64)
    opt = DemoDynamics(model=model, n_steps=5, dt=0.5, convergence_hook=ConvergenceHook.from_fmax(1e-9))
    out = (opt + DemoDynamics(model=model, n_steps=3, dt=0.5)).run(batch)
    assert out.status.shape == (2, 1) and out.status.reshape(-1).tolist() == [2, 2]
    assert out.fmax.shape == (2, 1) and bool(torch.isfinite(out.fmax).all())
    flat = make_batch([3, 4], dtype=torch.float64)
    ref = (DemoDynamics(model=model, n_steps=5, dt=0.5, convergence_hook=ConvergenceHook.from_fmax(1e-9))
           + DemoDynamics(model=model, n_steps=3, dt=0.5)).run(flat)
    assert ref.status.shape == (2,)
    torch.testing.assert_close(out.positions, ref.positions, rtol=0, atol=0)


def test_on_converge_hooks_fire_only_when_something_converged():
    on_converge = Calls(DynamicsStage.ON_CONVERGE)
    batch = make_batch([3, 4], dtype=torch.float64)
    # A criterion no system meets: the hook never fires (it fired at every check before).
    never = DemoDynamics(model=DemoModelWrapper(), n_steps=20, dt=0.5, hooks=[on_converge],
                         convergence_hook=ConvergenceHook.from_fmax(1e-12))
    never.run(batch)
    assert on_converge.steps == []
    # One that every system meets at once: the hook fires once, at that check.
    at_once = Calls(DynamicsStage.ON_CONVERGE)
    DemoDynamics(model=DemoModelWrapper(), n_steps=20, dt=0.5, hooks=[at_once],
                 convergence_hook=ConvergenceHook.from_fmax(1e9)).run(make_batch([3, 4], dtype=torch.float64))
    assert len(at_once.steps) == 1


def test_step_count_is_n_after_run_n():
    stage = DemoDynamics(model=DemoModelWrapper(), n_steps=7, dt=0.5)
    stage.run(make_batch([3]))
    assert stage.step_count == 7
    stage.run(make_batch([3]), n_steps=4)
    assert stage.step_count == 4
    model = DemoModelWrapper()
    fused = DemoDynamics(model=model, n_steps=3, dt=0.5) + DemoDynamics(model=model, n_steps=2, dt=0.5)
    fused.run(make_batch([3, 2]))
    assert fused.step_count == 5


def test_fused_stage_step_is_one_shared_forward_with_masked_updates_and_status_migration():
    model = CountingModel()
    opt = DemoDynamics(model=model, n_steps=100, dt=0.5, convergence_hook=ConvergenceHook.from_fmax(1e9))
    md = DemoDynamics(model=model, n_steps=100, dt=0.25)
    fused = FusedStage([(0, opt), (1, md)])
    batch = make_batch([3, 4], dtype=torch.float64)
    batch.status = torch.tensor([0, 1])  # one system in each stage
    batch.velocities = torch.full_like(batch.positions, 0.01)
    alone = [batch.index_select(torch.tensor([i])) for i in (0, 1)]
    fused.step(batch)
    before = model.calls
    # Masked updates: each system moved exactly as its own stage alone would move it.
    DemoDynamics(model=DemoModelWrapper(), n_steps=100, dt=0.5).step(alone[0])
    DemoDynamics(model=DemoModelWrapper(), n_steps=100, dt=0.25).step(alone[1])
    torch.testing.assert_close(batch.positions[:3], alone[0].positions, rtol=0, atol=1e-15)
    torch.testing.assert_close(batch.positions[3:], alone[1].positions, rtol=0, atol=1e-15)
    # Status migration at the check: the converged system of stage 0 moved on to stage 1.
    assert batch.status.tolist() == [1, 1]
    fused.step(batch)
    assert model.calls - before == 1  # one forward per step, shared by both stages
    assert fused.step_count == 2
