"""The core imports and runs the seed's basic example."""

from __future__ import annotations

import torch

from alchemi_core.data import AtomicData, Batch
from alchemi_core.dynamics import DemoDynamics
from alchemi_core.models.demo import DemoModelWrapper


def test_demo_dynamics_runs():
    batch = Batch.from_data_list([AtomicData(atomic_numbers=torch.tensor([6, 8, 1]), positions=torch.randn(3, 3))])
    out = DemoDynamics(model=DemoModelWrapper(), n_steps=10, dt=0.5).run(batch)
    assert torch.isfinite(out.positions).all()
