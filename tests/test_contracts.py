"""The model and hook contracts hold for core's own demo parts and catch wrong implementations."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.dynamics import Hook
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import random_structures
from alchemi_core.testing.hook_contract import HookContract
from alchemi_core.testing.model_contract import ModelContract


class TestDemoModel(ModelContract):
    """The demo model: all pairs, no cell (small molecules, spread so no pair sits too close)."""

    def make_model(self):
        return DemoModelWrapper()

    def structures(self, dtype=torch.float64):
        return random_structures([4, 6, 3], dtype=dtype, spread=1.2)


class _Scaled(DemoModelWrapper):
    """Forces 2 % too large: what a missing factor in a kernel looks like."""

    def forward(self, batch, compute_stress=False):
        out = super().forward(batch, compute_stress)
        return {"energy": out["energy"], "forces": out["forces"] * 1.02}


class _Anchored(DemoModelWrapper):
    """An energy that depends on where the system is (a stray absolute position)."""

    def forward(self, batch, compute_stress=False):
        out = dict(super().forward(batch, compute_stress))
        e = torch.zeros_like(out["energy"]).index_add_(0, batch.batch_idx, batch.positions[:, :1] * 1e-3)
        return {"energy": out["energy"] + e, "forces": out["forces"] - 1e-3 * torch.tensor([1.0, 0, 0])}


class _Crosstalk(DemoModelWrapper):
    """Each system's energy sees the batch's mean position: batching changes the answer."""

    def forward(self, batch, compute_stress=False):
        out = super().forward(batch, compute_stress)
        return {"energy": out["energy"] + 1e-3 * batch.positions.mean(), "forces": out["forces"]}


@pytest.mark.parametrize(
    ("model", "test"),
    [
        (_Scaled, "test_forces_are_minus_the_energy_gradient"),
        (_Anchored, "test_translation_changes_nothing"),
        (_Crosstalk, "test_a_system_alone_equals_the_same_system_in_a_batch"),
    ],
)
def test_model_contract_catches_wrong_models(model, test):
    contract = TestDemoModel()
    contract.make_model = model  # type: ignore[method-assign]
    with pytest.raises(AssertionError):
        getattr(contract, test)()


class _Count(Hook):
    stage = DynamicsStage.AFTER_STEP

    def __init__(self):
        super().__init__(frequency=2)
        self.calls = 0

    def on_run_start(self, batch, dynamics):
        self.calls = 0

    def __call__(self, batch, dynamics):
        self.calls += 1


class TestCountingHook(HookContract):
    def make_hook(self):
        return _Count()


class _DampsEverything(Hook):
    """Slows every system down, not only its stage's: the bug the contract looks for."""

    stage = DynamicsStage.AFTER_POST_UPDATE

    def __call__(self, batch, dynamics):
        batch.velocities.mul_(0.9)


def test_hook_contract_catches_a_hook_that_touches_other_stages(tmp_path):
    contract = TestCountingHook()
    contract.make_hook = _DampsEverything  # type: ignore[method-assign]
    contract.tmp_path = tmp_path
    with pytest.raises(AssertionError, match="another stage"):
        contract.test_leaves_the_systems_of_other_stages_alone()
