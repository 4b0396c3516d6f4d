"""Shared structures, a recording hook and small models for the alchemi-hooks tests."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from alchemi_core.data import AtomicData, Batch
from alchemi_core.dynamics import DynamicsStage, Hook

pytest_plugins = ["alchemi_core.testing.fixtures"]


def make_molecule(
    num_atoms: int,
    seed: int,
    speed: float = 0.01,
    frozen_every: int = 0,
    dtype: torch.dtype = torch.float32,
) -> AtomicData:
    """A small cluster on a 1.2 Å grid (no overlaps, so DemoModelWrapper forces stay moderate)
    with random velocities (Å/fs); every ``frozen_every``-th atom frozen when > 0."""
    g = torch.Generator().manual_seed(seed)
    grid = torch.stack(torch.meshgrid(*(torch.arange(3.0),) * 3, indexing="ij"), dim=-1).reshape(-1, 3)
    pos = grid[:num_atoms] * 1.2 + 0.05 * torch.randn(num_atoms, 3, generator=g)
    fields: dict[str, Any] = {
        "atomic_numbers": torch.randint(1, 9, (num_atoms,), generator=g),
        "positions": pos.to(dtype),
        "velocities": (speed * torch.randn(num_atoms, 3, generator=g)).to(dtype),
        "cell": torch.eye(3, dtype=dtype) * 20.0,
        "pbc": torch.tensor([False, False, False]),
    }
    if frozen_every:
        fields["frozen"] = torch.arange(num_atoms) % frozen_every == 0
    return AtomicData(**fields)


@pytest.fixture
def molecules():
    """``molecules(sizes, **kw)``: a batch of :func:`make_molecule` systems, system_id 0..B-1."""

    def make(sizes: list[int], **kwargs: Any) -> Batch:
        batch = Batch.from_data_list([make_molecule(n, seed=i, **kwargs) for i, n in enumerate(sizes)])
        batch.set_field("system_id", torch.arange(len(sizes)), "system")
        return batch

    return make


@pytest.fixture
def molecule():
    return make_molecule


class Recorder(Hook):
    """Copies what a logging or snapshot hook should see, at the same point and frequency."""

    stage = DynamicsStage.AFTER_STEP

    def __init__(self, frequency: int = 1, stage: DynamicsStage | None = None) -> None:
        super().__init__(frequency=frequency, stage=stage)
        self.records: list[dict[str, Any]] = []

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        mask = dynamics.context.system_mask
        rec = {
            "step": dynamics.step_count,
            "in_stage": np.ones(batch.num_graphs, bool) if mask is None else mask.cpu().numpy().copy(),
            "sizes": batch.num_nodes_per_system.copy(),
        }
        for key in ("system_id", "status", "energy", "positions", "velocities", "forces", "atomic_masses"):
            rec[key] = getattr(batch, key).detach().cpu().numpy().copy()
        if "frozen" in batch:
            rec["frozen"] = batch.frozen.cpu().numpy().copy()
        self.records.append(rec)


@pytest.fixture
def recorder():
    return Recorder
