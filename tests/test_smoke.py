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


def test_the_demo_models_pair_table_is_every_ordered_pair_within_each_system():
    import itertools

    import numpy as np

    from alchemi_core.models.demo import _ordered_pairs

    rng = np.random.default_rng(0)
    for _ in range(50):
        counts = rng.integers(0, 7, size=rng.integers(0, 12))
        starts = np.cumsum(counts) - counts
        expected = [(o + a, o + b, s) for s, (o, n) in enumerate(zip(starts, counts))
                    for a, b in itertools.product(range(n), repeat=2) if a != b]
        i, j, system = _ordered_pairs(counts.astype(np.int64))
        assert list(zip(i.tolist(), j.tolist(), system.tolist())) == [tuple(map(int, e)) for e in expected]
