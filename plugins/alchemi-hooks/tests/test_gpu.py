"""The hooks on a CUDA device: same results as on the CPU, and no host synchronisation inside
steps where a hook has no reason to read back.

Run on the GPU machine: ``pytest -m gpu plugins/alchemi-hooks/tests``.
"""

from __future__ import annotations

import csv

import pytest
import torch

from alchemi_core.dynamics import DemoDynamics, DynamicsStage, HostMemory
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_hooks.clamp import MaxForceClampHook
from alchemi_hooks.freeze import FreezeAtomsHook
from alchemi_hooks.logger import LoggingHook
from alchemi_hooks.snapshot import SnapshotHook
from alchemi_hooks.timing import StageTimingHook
from alchemi_hooks.wrap import WrapPeriodicHook

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


class SyncGuard:
    """From step ``start`` until after step ``last``, any synchronising CUDA call raises (torch's
    sync debug mode). The window is the steps: a run's preparation and its one health check
    after the last step read back by design."""

    stage = DynamicsStage.BEFORE_STEP
    frequency = 1

    def __init__(self, start: int = 2, last: int | None = None) -> None:
        self.start, self.last = start, last

    def __call__(self, batch, dynamics):
        if dynamics.step_count == self.start:
            torch.cuda.set_sync_debug_mode("error")

    def on_run_end(self, batch, dynamics):
        torch.cuda.set_sync_debug_mode("default")

    def closer(self) -> SyncGuardEnd:
        """The ``AFTER_STEP`` half that ends the window after step ``last``."""
        assert self.last is not None
        return SyncGuardEnd(self.last)


class SyncGuardEnd:
    stage = DynamicsStage.AFTER_STEP
    frequency = 1

    def __init__(self, last: int) -> None:
        self.last = last
        self.closed = False

    def __call__(self, batch, dynamics):
        if dynamics.step_count == self.last:
            torch.cuda.set_sync_debug_mode("default")
            self.closed = True


def per_step_hooks(tmp_path):
    return [
        MaxForceClampHook(max_force=0.5),
        FreezeAtomsHook(),
        WrapPeriodicHook(frequency=5),
        LoggingHook(log_path=tmp_path / "gpu.csv", frequency=5),
        StageTimingHook(report=False),
    ]


def test_step_path_hooks_never_synchronise(tmp_path, molecules):
    batch = molecules([4, 6, 5, 8], speed=0.02, frozen_every=3).to("cuda")
    guard = SyncGuard(start=2, last=29)
    end = guard.closer()
    hooks = [guard, *per_step_hooks(tmp_path), end]
    try:
        DemoDynamics(model=DemoModelWrapper(), n_steps=30, dt=0.5, hooks=hooks).run(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert end.closed  # the window covered every step from 2 to the last
    rows = list(csv.DictReader(open(tmp_path / "gpu.csv")))
    assert len(rows) == 4 * 6


def test_results_match_the_cpu(tmp_path, molecules):
    results = {}
    for device in ("cpu", "cuda"):
        batch = molecules([4, 6, 5], speed=0.02, frozen_every=3).to(device)
        sink = HostMemory(capacity=None)
        hooks = [*per_step_hooks(tmp_path / device), SnapshotHook(sink, frequency=10)]
        DemoDynamics(model=DemoModelWrapper(), n_steps=40, dt=0.5, hooks=hooks).run(batch)
        log = list(csv.DictReader(open(tmp_path / device / "gpu.csv")))
        results[device] = (batch.positions.cpu(), sink.read().positions, log, hooks[-2].summary())
    cpu, gpu = results["cpu"], results["cuda"]
    assert torch.allclose(cpu[0], gpu[0], atol=1e-4)
    assert torch.allclose(cpu[1], gpu[1], atol=1e-4)
    assert len(cpu[2]) == len(gpu[2])
    for a, b in zip(cpu[2], gpu[2], strict=True):
        assert a["system_id"] == b["system_id"] and a["step"] == b["step"]
        assert float(a["temperature"]) == pytest.approx(float(b["temperature"]), rel=1e-3, abs=1e-3)
    timing = gpu[3]
    assert timing["device"] == "cuda" and timing["steps"] == 40
    assert timing["phases"]["compute"]["total_s"] > 0 and timing["phases"]["compute"]["intervals"] == 40


def test_frozen_atoms_hold_on_the_gpu(molecules):
    batch = molecules([5, 7], speed=0.03, frozen_every=2).to("cuda")
    start = batch.positions.clone()
    DemoDynamics(model=DemoModelWrapper(), n_steps=100, dt=0.5, hooks=[FreezeAtomsHook()]).run(batch)
    frozen = batch.frozen
    assert torch.equal(batch.positions[frozen], start[frozen])
    assert (batch.positions[~frozen] - start[~frozen]).abs().max() > 1e-2
