"""SnapshotHook and ConvergedSnapshotHook with HostMemory and a sink written here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from alchemi_core.data import Batch
from alchemi_core.dynamics import ConvergenceHook, DataSink, DemoDynamics, DynamicsStage, FusedStage, HostMemory
from alchemi_core.errors import CapacityError, ConfigurationError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_hooks.snapshot import ConvergedSnapshotHook, SnapshotHook


class StepTaggingSink(DataSink):
    """Keeps each write apart, with the system ids and positions it held."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.writes: list[dict] = []
        self._capacity = capacity

    def write(self, batch: Batch, mask: torch.Tensor | None = None) -> None:
        chosen = batch if mask is None else batch.index_select(mask)
        if len(self) + chosen.num_graphs > self.capacity:
            raise CapacityError("StepTaggingSink is full")
        ids, positions = chosen.system_id.tolist(), chosen.positions.clone()
        self.writes.append({"system_id": ids, "positions": positions, "batch": chosen})

    def read(self) -> Batch:
        out = self.writes[0]["batch"].clone()
        for w in self.writes[1:]:
            out.append(w["batch"])
        return out

    def zero(self) -> None:
        self.writes = []

    def __len__(self) -> int:
        return sum(len(w["system_id"]) for w in self.writes)

    @property
    def capacity(self) -> int:
        return self._capacity


def test_host_memory_holds_every_system_at_every_snapshot_step(molecules, recorder):
    batch = molecules([3, 5, 4], speed=0.02)
    sink = HostMemory(capacity=None)
    rec = recorder(frequency=10)
    DemoDynamics(model=DemoModelWrapper(), n_steps=30, dt=0.5, hooks=[SnapshotHook(sink, frequency=10), rec]).run(batch)
    out = sink.read()
    assert out.num_graphs == 3 * 3
    assert out.system_id.tolist() == [0, 1, 2] * 3
    expected = np.concatenate([r["positions"] for r in rec.records])
    assert np.array_equal(out.positions.numpy(), expected)
    # Snapshots are copies: later steps did not change them.
    assert not np.array_equal(out.positions[: batch.num_nodes].numpy(), batch.positions.numpy())


def test_fused_stage_snapshots_only_its_systems(molecules, recorder):
    batch = molecules([3, 4, 5, 3])
    batch.set_field("status", torch.tensor([0, 1, 0, 1]), "system")
    sink = StepTaggingSink()
    rec = recorder(frequency=2)
    opt = DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5)
    md = DemoDynamics(model=DemoModelWrapper(), n_steps=8, dt=0.5, hooks=[SnapshotHook(sink, frequency=2), rec])
    FusedStage([(0, opt), (1, md)]).run(batch)
    assert len(sink.writes) == len(rec.records)
    for write, r in zip(sink.writes, rec.records, strict=True):
        ids = r["system_id"][r["in_stage"]].tolist()
        assert write["system_id"] == ids
        start = np.concatenate(([0], np.cumsum(r["sizes"])))
        want = np.concatenate([r["positions"][start[i] : start[i + 1]] for i in np.nonzero(r["in_stage"])[0]])
        assert np.array_equal(write["positions"].numpy(), want)
    # 1 and 3 start in MD; 0 and 2 join after 3 steps; 1 and 3 leave after their 8 MD steps.
    assert sink.writes[0]["system_id"] == [1, 3]
    assert any(sorted(w["system_id"]) == [0, 1, 2, 3] for w in sink.writes)
    assert sink.writes[-1]["system_id"] == [0, 2]


def test_a_full_sink_raises_instead_of_dropping(molecules):
    sink = HostMemory(capacity=4)
    md = DemoDynamics(model=DemoModelWrapper(), n_steps=10, dt=0.5, hooks=[SnapshotHook(sink, frequency=1)])
    with pytest.raises(CapacityError):
        md.run(molecules([3, 3]))
    assert len(sink) == 4


def test_converged_snapshot_writes_each_system_once_when_it_converges(molecules):
    batch = molecules([3, 4, 5, 4, 3])
    sink = StepTaggingSink()
    threshold = 0.2
    opt = DemoDynamics(
        model=DemoModelWrapper(),
        n_steps=300,
        dt=1.0,
        convergence_hook=ConvergenceHook.from_fmax(threshold, frequency=5),
        hooks=[ConvergedSnapshotHook(sink)],
    )
    class Damp:
        """Friction, so the MD relaxes: systems converge one after another."""

        stage = DynamicsStage.AFTER_STEP
        frequency = 1

        def __call__(self, b, d):
            b.velocities.mul_(0.8)

    opt.hooks.append(Damp())
    out = opt.run(batch)
    converged = (out.status == 1).nonzero().flatten().tolist()
    assert len(converged) >= 3
    assert len(sink.writes) >= 2  # at different checks
    written = [sid for w in sink.writes for sid in w["system_id"]]
    assert sorted(written) == sorted(out.system_id[converged].tolist())  # each exactly once
    snap = sink.read()
    assert (snap.status == 1).all()
    assert DemoModelWrapper()(snap)["forces"].norm(dim=1).max() <= threshold


def test_rejects_something_that_is_not_a_sink():
    with pytest.raises(ConfigurationError, match="DataSink"):
        SnapshotHook(sink=[], frequency=5)
