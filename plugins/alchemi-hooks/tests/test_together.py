"""All hooks at once: a relax-then-MD FusedStage streaming from a sampler (inflight refill)."""

from __future__ import annotations

import csv
import io

import torch

from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import ConvergenceHook, DemoDynamics, FusedStage, HostMemory, SizeAwareSampler
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_hooks.clamp import MaxForceClampHook
from alchemi_hooks.drift import EnergyDriftMonitorHook
from alchemi_hooks.freeze import FreezeAtomsHook
from alchemi_hooks.logger import LoggingHook
from alchemi_hooks.nonfinite import NaNDetectorHook
from alchemi_hooks.progress import ProgressHook
from alchemi_hooks.snapshot import ConvergedSnapshotHook, SnapshotHook
from alchemi_hooks.timing import StageTimingHook
from alchemi_hooks.wrap import WrapPeriodicHook


def test_every_hook_in_a_streaming_fused_run(tmp_path, molecule):
    data = [molecule(n, seed=i, speed=0.02, frozen_every=3) for i, n in enumerate([4, 6, 5, 3, 6, 4, 5, 3])]
    originals = {i: d.positions.clone() for i, d in enumerate(data)}
    sampler = SizeAwareSampler(ListDataset(data), max_atoms=16, max_batch_size=3, bin_width=1)
    relaxed, trajectory, results = HostMemory(None), HostMemory(None), HostMemory(None)
    opt = DemoDynamics(
        model=DemoModelWrapper(), n_steps=15, dt=1.0, sampler=sampler, refill_frequency=3, sinks=[results],
        convergence_hook=ConvergenceHook.from_fmax(0.25, frequency=3),
        hooks=[
            MaxForceClampHook(max_force=2.0), FreezeAtomsHook(), NaNDetectorHook(frequency=3),
            ConvergedSnapshotHook(relaxed),
        ],
    )
    md = DemoDynamics(
        model=DemoModelWrapper(), n_steps=12, dt=0.5,
        hooks=[
            FreezeAtomsHook(), LoggingHook(log_path=tmp_path / "md.csv", frequency=4),
            SnapshotHook(trajectory, frequency=6),
            EnergyDriftMonitorHook(threshold=1e-3, frequency=4, action="raise"),
            WrapPeriodicHook(frequency=5),
        ],
    )
    out = io.StringIO()
    timing = StageTimingHook(report=False)
    fused = FusedStage([(0, opt), (1, md)], hooks=[ProgressHook(frequency=5, backend="plain", file=out), timing])
    assert fused.run() is None

    final = results.read()
    assert sorted(final.system_id.tolist()) == list(range(8))  # each system graduated exactly once
    assert (final.status == 2).all()
    for row, sid in enumerate(final.system_id.tolist()):
        lo, hi = int(final.batch_ptr[row]), int(final.batch_ptr[row + 1])
        frozen = final.frozen[lo:hi]
        assert torch.equal(final.positions[lo:hi][frozen], originals[sid][frozen])
    assert set(relaxed.read().system_id.tolist()) <= set(range(8))
    rows = list(csv.DictReader(open(tmp_path / "md.csv")))
    assert rows and {int(r["status"]) for r in rows} == {1}
    assert {int(r["system_id"]) for r in rows} == set(range(8))  # every system did MD
    assert set(trajectory.read().status.tolist()) == {1}
    assert timing.summary()["steps"] > 0 and timing.summary()["phases"]["compute"]["intervals"] > 0
    done = [int(line.split("| ")[1].split(" done")[0]) for line in out.getvalue().splitlines()]
    assert done == sorted(done) and done[0] == 0 and done[-1] >= 4
