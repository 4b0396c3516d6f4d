"""The step contract: what each stage's StepContext holds during a run, and the old names."""

from __future__ import annotations

import torch

from alchemi_core.dynamics import DemoDynamics, FusedStage, Hook, StepContext
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import make_batch


class Record(Hook):
    """Keeps, at every step, what the context says."""

    stage = DynamicsStage.AFTER_STEP

    def __init__(self) -> None:
        super().__init__(frequency=1)
        self.seen: list[tuple[int, int, list[bool] | None, float]] = []

    def __call__(self, batch, dynamics) -> None:
        ctx = dynamics.context
        assert isinstance(ctx, StepContext) and ctx.batch is batch
        mask = None if ctx.system_mask is None else ctx.system_mask.tolist()
        self.seen.append((ctx.step, ctx.version, mask, float(ctx.weighted_inv_mass.sum())))


def test_each_stage_sees_its_own_systems_and_a_new_version_when_they_move():
    model = DemoModelWrapper()
    first_hook, second_hook, own = Record(), Record(), Record()
    first = DemoDynamics(model=model, n_steps=3, dt=0.25, hooks=[first_hook])
    second = DemoDynamics(model=model, n_steps=4, dt=0.25, hooks=[second_hook])
    batch = make_batch([3, 2], dtype=torch.float64)
    FusedStage([(0, first), (1, second)], hooks=[own]).run(batch)
    # System 0 and 1 run stage 0 for 3 steps, then stage 1 for 4.
    assert [s[0] for s in first_hook.seen] == list(range(7))
    assert first_hook.seen[0][2] == [True, True] and first_hook.seen[3][2] == [False, False]
    assert second_hook.seen[0][2] == [False, False] and second_hook.seen[3][2] == [True, True]
    versions = [s[1] for s in first_hook.seen]
    # Rewritten at every check (here every step), and so at the move; never going back.
    assert versions[3] != versions[2] and versions == sorted(versions)
    assert first_hook.seen[4][3] == 0.0  # no atom is stage 0's any more: its kicks move nothing
    # The fused stage's own hooks see every system that is in one of its stages: both, all along
    # (they graduate at the check after the last step).
    assert all(s[2] == [True, True] for s in own.seen) and len(own.seen) == 7


def test_the_run_is_read_through_the_context():
    md = DemoDynamics(model=DemoModelWrapper(), n_steps=2, dt=0.25)
    md.run(make_batch([2, 2]))
    ctx = md.context
    for old in ("system_mask", "node_weight", "weighted_inv_mass", "mask_version"):  # removed in 0.1.0
        assert not hasattr(md, old)
    assert ctx.step == 1 and md.step_count == 2  # the last step's index; steps completed (as nvalchemi)
    assert ctx.run is not None and ctx.run.steps_done == 2 and not ctx.run.ends_on_graduation


def test_versions_are_never_reused_across_runs():
    md = DemoDynamics(model=DemoModelWrapper(), n_steps=1, dt=0.25)
    md.run(make_batch([2]))
    first = md.context.version
    md.run(make_batch([2]))
    assert md.context.version > first
