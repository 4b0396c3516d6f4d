"""The core's ``parts`` protocol: one hook object acting at several points of a step."""

from __future__ import annotations

import pytest

from alchemi_core.dynamics import DemoDynamics, DynamicsStage, Hook
from alchemi_core.errors import ConfigurationError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_hooks.parts import HookPart


class TwoPoints(Hook):
    stage = DynamicsStage.BEFORE_PRE_UPDATE

    def __init__(self):
        super().__init__()
        self.calls = []
        self.started = 0
        self.parts = (
            HookPart(DynamicsStage.BEFORE_PRE_UPDATE, lambda b, d: self.calls.append(("before", d.step_count))),
            HookPart(DynamicsStage.AFTER_COMPUTE, lambda b, d: self.calls.append(("after", d.step_count)), frequency=2),
        )

    def on_run_start(self, batch, dynamics):
        self.started += 1


def test_parts_run_at_their_points_and_frequencies_lifecycle_on_the_outer_hook(molecules):
    hook = TwoPoints()
    DemoDynamics(model=DemoModelWrapper(), n_steps=4, dt=0.5, hooks=[hook]).run(molecules([3]))
    assert hook.calls == [
        ("before", 0), ("after", 0), ("before", 1), ("before", 2), ("after", 2), ("before", 3),
    ]
    assert hook.started == 1


def test_a_malformed_part_is_rejected_at_construction():
    hook = TwoPoints()
    hook.parts = (object(),)
    with pytest.raises(ConfigurationError, match="not a hook"):
        DemoDynamics(model=DemoModelWrapper(), n_steps=1, hooks=[hook])


class OwnMethod(Hook):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.parts = (HookPart(DynamicsStage.AFTER_COMPUTE, self.count),)

    def count(self, batch, dynamics):
        self.calls += 1


def test_a_part_holds_its_hooks_method_weakly_and_says_when_the_hook_is_gone():
    hook = OwnMethod()
    part = hook.parts[0]
    part(None, None)
    assert hook.calls == 1
    del hook  # no cycle through the part: freed at once
    with pytest.raises(ReferenceError, match="hook was freed"):
        part(None, None)
    plain = HookPart(DynamicsStage.AFTER_COMPUTE, lambda b, d: None)
    plain(None, None)  # a function is held strongly (nothing else may hold it)


def test_a_method_of_an_object_that_is_not_a_hook_is_held_as_given():
    class Helper:
        calls = 0

        def note(self, batch, dynamics):
            Helper.calls += 1

    part = HookPart(DynamicsStage.AFTER_COMPUTE, Helper().note)  # the part alone holds the helper
    part(None, None)
    assert Helper.calls == 1
