"""W5: W1 108x2048 with a snapshot of every system and a log row per system every 100 steps,
against the same run without them.

Each framework writes through its own storage: alchemi a ``SnapshotHook`` into an asynchronous
``ZarrData`` and a CSV ``LoggingHook``; nvalchemi its ``SnapshotHook`` into its ``ZarrData`` and
its CSV ``LoggingHook``; TorchSim its ``TrajectoryReporter`` (one HDF5 file per system, no log). Runs with and without snapshots alternate
(``repeats`` pairs, S steps each, S a multiple of 100 sized to the framework's speed); the
slowdown is the ratio of the medians, minus one. Check: the store holds ``snapshots x systems``
records, read back from it.

Example:
    >>> from benchmarks.w5_snapshots import steps_for
    >>> steps_for(0.001, every=100, quick=False)
    2000
"""

from __future__ import annotations

import shutil
from typing import Any

from benchmarks import spec
from benchmarks.adapters import Framework
from benchmarks.harness import Context, attempt
from benchmarks.structures import replicated_crystal
from benchmarks.timing import check_deadline, median, timed

REPEATS = 3
TARGET_S = 2.0


def steps_for(step_s: float, every: int, quick: bool) -> int:
    """Steps per timed run: a multiple of ``every``, about ``TARGET_S`` seconds, 2-50 snapshots.

    The run ends with a snapshot whose write the timed run waits for; runs of seconds make that
    last write weigh as it does in a real run, not as a tenth of the time."""
    if quick:
        return 2 * every
    snapshots = max(2, min(50, int(TARGET_S / (step_s * every))))
    return snapshots * every


def _measure(fw: Framework, crystal: Any, every: int, ctx: Context, cap: float) -> dict[str, Any]:
    device, quick = ctx.device, ctx.quick
    folder = ctx.scratch / f"w5-{fw.name}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    plain = fw.md(crystal, device)
    snap = fw.md(crystal, device, snapshots=folder, every=every)
    try:
        plain.run(3)  # compilation and capture; the snapshot run shares the kernels
        deadline = ctx.budget.deadline(cap)
        # The cost of a step alone: the difference of two runs cancels what every run costs once
        # (a 50-step run alone took three times as long per step, and the timed runs came out
        # a third of the intended length).
        short, long = timed(lambda: plain.run(50), device), timed(lambda: plain.run(250), device)
        step_s = (long - short) / 200 if long > short else long / 250
        steps = steps_for(step_s, every, quick)
        t_plain, t_snap = [], []
        for _ in range(2 if quick else REPEATS):
            t_plain.append(timed(lambda: plain.run(steps), device))
            t_snap.append(timed(lambda: snap.run(steps), device))
            check_deadline(deadline)
        records = snap.snapshots_written()
        expected = len(t_snap) * (steps // every) * crystal.num_systems
        base, with_snapshots = median(t_plain), median(t_snap)
        return {
            "ms_per_step": 1e3 * base / steps,
            "ms_per_step_snapshots": 1e3 * with_snapshots / steps,
            "slowdown_percent": 100.0 * (with_snapshots / base - 1.0),
            "steps": steps,
            "records": {"written": records, "expected": expected, "passed": records == expected},
        }
    finally:
        plain.close()
        snap.close()
        shutil.rmtree(folder, ignore_errors=True)


def run_case(ctx: Context, cap: float) -> dict[str, Any]:
    atoms, systems = (108, 4) if ctx.quick else spec.W5_SHAPE
    every = 10 if ctx.quick else spec.W5_EVERY
    crystal = replicated_crystal(atoms, systems, spec.LANGEVIN.temperature, seed=0)
    results = {
        name: attempt(ctx, name, cap, lambda fw, _: _measure(fw, crystal, every, ctx, cap)) for name in ctx.frameworks
    }
    return {
        "id": "W5",
        "case": f"{atoms}x{systems}",
        "title": (
            f"W5 W1 {atoms}x{systems} with a snapshot and a log row of every system every {every} "
            f"steps, against neither ({ctx.device})"
        ),
        "params": {"atoms_per_system": atoms, "systems": systems, "every": every},
        "metric": "slowdown_percent",
        "results": results,
        "ratios": {},
    }
