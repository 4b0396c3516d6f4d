"""NaNDetectorHook names the right system, field and atom, and only looks at its stage."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.dynamics import DemoDynamics, DynamicsStage, FusedStage, StepContext
from alchemi_core.errors import AlchemiError, ConfigurationError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_hooks.errors import NonFiniteError
from alchemi_hooks.nonfinite import NaNDetectorHook


class PoisonedModel(DemoModelWrapper):
    """The demo model, but one atom's force is NaN from ``from_step`` forward calls on."""

    def __init__(self, system_id: int, atom: int, from_step: int) -> None:
        super().__init__()
        self.system_id, self.atom, self.from_step, self.calls = system_id, atom, from_step, 0

    def forward(self, batch, compute_stress=False):
        out = super().forward(batch)
        self.calls += 1
        if self.calls > self.from_step:
            rows = (batch.system_id == self.system_id).nonzero().flatten()
            if len(rows):
                out["forces"][int(batch.batch_ptr[rows[0]]) + self.atom, 1] = float("nan")
        return out


def test_names_the_system_and_atom_with_nan_forces(molecules):
    model = PoisonedModel(system_id=2, atom=3, from_step=6)
    hook = NaNDetectorHook(frequency=1, stage=DynamicsStage.AFTER_COMPUTE)
    md = DemoDynamics(model=model, n_steps=50, dt=0.5, hooks=[hook])
    with pytest.raises(NonFiniteError) as info:
        md.run(molecules([3, 5, 6, 4]))
    err = info.value
    assert isinstance(err, AlchemiError)
    assert err.step == 5  # forward call 7 is step 5's (one call before the first step)
    assert err.system_ids == [2]
    assert err.atoms == {2: {"forces": [3]}}
    assert "system_id 2" in str(err) and "forces at atoms [3]" in str(err)


def test_positions_poisoned_through_the_integrator_are_found_at_the_check_frequency(molecules):
    model = PoisonedModel(system_id=1, atom=0, from_step=3)
    hook = NaNDetectorHook(frequency=4, fields=("positions", "forces", "energy"))
    md = DemoDynamics(model=model, n_steps=50, dt=0.5, hooks=[hook])
    with pytest.raises(NonFiniteError) as info:
        md.run(molecules([3, 5, 4]))
    err = info.value
    assert err.step == 4  # NaN forces from step 2 on; checked at steps 0, 4, ...
    assert err.system_ids == [1]
    # The NaN spread from atom 0's force to its position, then to every force of system 1.
    assert 0 in err.atoms[1]["positions"]
    assert err.atoms[1]["forces"] == [0, 1, 2, 3, 4]
    assert "energy" in err.atoms[1]


def test_only_the_stage_systems_are_checked(molecules):
    from types import SimpleNamespace

    batch = molecules([3, 4, 5])
    batch.set_field("forces", torch.zeros(batch.num_nodes, 3), "node")
    batch.forces[1, 2] = float("inf")  # system 0, atom 1
    hook = NaNDetectorHook(frequency=1)
    md = SimpleNamespace(context=StepContext.standalone(batch, system_mask=torch.tensor([False, True, True])), step_count=3, name="md")
    hook(batch, md)
    with pytest.raises(NonFiniteError, match=r"system_id 0: forces at atoms \[1\]"):
        mask = torch.tensor([True, False, False])
        hook(batch, SimpleNamespace(context=StepContext.standalone(batch, system_mask=mask), step_count=3, name="opt"))


def test_a_clean_run_in_a_fused_stage_passes(molecules):
    batch = molecules([3, 4, 5])
    batch.set_field("status", torch.tensor([0, 1, 1]), "system")
    hooks = [NaNDetectorHook(frequency=1, fields=("positions", "forces", "velocities", "energy"))]
    opt = DemoDynamics(model=DemoModelWrapper(), n_steps=5, dt=0.5, hooks=hooks)
    md = DemoDynamics(model=DemoModelWrapper(), n_steps=5, dt=0.5, hooks=hooks)
    out = FusedStage([(0, opt), (1, md)]).run(batch)
    assert (out.status == 2).all()


def test_a_missing_field_is_named_when_the_run_starts(molecules):
    md = DemoDynamics(model=DemoModelWrapper(), n_steps=2, hooks=[NaNDetectorHook(fields=("charges",))])
    with pytest.raises(ConfigurationError, match="charges"):
        md.run(molecules([3]))
