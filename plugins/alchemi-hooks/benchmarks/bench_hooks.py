"""Per-step cost of LoggingHook and SnapshotHook every 100 steps, against no hooks.

Runs velocity Verlet (``DemoDynamics`` with ``DemoModelWrapper``) on a batch of small clusters
with: no hooks; ``LoggingHook`` every 100 steps; ``SnapshotHook`` (``HostMemory``) every 100
steps; both; and the per-step hooks (``MaxForceClampHook``, ``FreezeAtomsHook``) for reference.
A second table times single hook calls on a prepared batch (host time per call, no device
synchronisation inside the timed loop, then one at its end): what a hook adds to a step when it
fires. Each case runs ``--repeats`` times after a warm-up run, the cases taking turns so that a busy
machine slows them alike; the fastest run is reported (the least disturbed) with its overhead
over no hooks. On a GPU, timings end with ``torch.cuda.synchronize()``; on a CPU torch uses one
thread (``--threads``) so that runs do not compete with each other's workers.

Usage::

    python plugins/alchemi-hooks/benchmarks/bench_hooks.py --device cpu
    python plugins/alchemi-hooks/benchmarks/bench_hooks.py --device cuda --systems 512 --atoms 32 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from alchemi_core.data import AtomicData, Batch
from alchemi_core.dynamics import DemoDynamics, HostMemory
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_hooks.clamp import MaxForceClampHook
from alchemi_hooks.freeze import FreezeAtomsHook
from alchemi_hooks.logger import LoggingHook
from alchemi_hooks.snapshot import SnapshotHook


def make_batch(systems: int, atoms: int, device: str) -> Batch:
    """Clusters on a 1.2 Å grid with small random displacements and velocities."""
    g = torch.Generator().manual_seed(0)
    side = round(atoms ** (1 / 3)) + 1
    grid = torch.stack(torch.meshgrid(*(torch.arange(float(side)),) * 3, indexing="ij"), dim=-1).reshape(-1, 3)
    data = [
        AtomicData(
            atomic_numbers=torch.randint(1, 9, (atoms,), generator=g),
            positions=grid[:atoms] * 1.2 + 0.05 * torch.randn(atoms, 3, generator=g),
            velocities=0.01 * torch.randn(atoms, 3, generator=g),
            frozen=torch.arange(atoms) % 4 == 0,
        )
        for _ in range(systems)
    ]
    return Batch.from_data_list(data, device=device)


def cases(out_dir: Path) -> dict[str, Callable[[], list[Any]]]:
    return {
        "none": lambda: [],
        "logging/100": lambda: [LoggingHook(log_path=out_dir / "log.csv", frequency=100)],
        "snapshot/100": lambda: [SnapshotHook(HostMemory(capacity=None), frequency=100)],
        "logging+snapshot/100": lambda: [
            LoggingHook(log_path=out_dir / "log.csv", frequency=100),
            SnapshotHook(HostMemory(capacity=None), frequency=100),
        ],
        "clamp/1": lambda: [MaxForceClampHook(max_force=10.0)],
        "freeze/1": lambda: [FreezeAtomsHook()],
    }


def seconds_per_step(hooks: list[Any], args: argparse.Namespace) -> float:
    batch = make_batch(args.systems, args.atoms, args.device)
    md = DemoDynamics(model=DemoModelWrapper(), n_steps=args.steps, dt=0.5, hooks=hooks)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    md.run(batch)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / args.steps


def host_us_per_call(hook: Any, args: argparse.Namespace, calls: int) -> float:
    """Median host time of ``calls`` calls of ``hook`` on a prepared batch (its run started)."""
    batch = make_batch(args.systems, args.atoms, args.device)
    md = DemoDynamics(model=DemoModelWrapper(), n_steps=1, dt=0.5)
    md.run(batch)  # leaves the batch prepared and md's masks set
    getattr(hook, "on_run_start", lambda b, d: None)(batch, md)
    samples = []
    try:
        for _ in range(calls):
            start = time.perf_counter()
            hook(batch, md)
            samples.append(time.perf_counter() - start)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
    finally:
        getattr(hook, "on_run_end", lambda b, d: None)(batch, md)
    return 1e6 * statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--systems", type=int, default=32)
    parser.add_argument("--atoms", type=int, default=16)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    if not args.device.startswith("cuda"):
        torch.set_num_threads(args.threads)
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        made = cases(Path(tmp))
        for make in made.values():
            seconds_per_step(make(), argparse.Namespace(**{**vars(args), "steps": 20}))  # warm-up
        for _ in range(args.repeats):
            for name, make in made.items():
                times.setdefault(name, []).append(seconds_per_step(make(), args))
        per_call = {
            "logging": host_us_per_call(LoggingHook(log_path=Path(tmp) / "calls.csv"), args, 200),
            "snapshot": host_us_per_call(SnapshotHook(HostMemory(capacity=None)), args, 200),
            "clamp": host_us_per_call(MaxForceClampHook(max_force=10.0), args, 200),
        }
    results = {
        name: {"us_per_step": 1e6 * min(t), "median_us": 1e6 * statistics.median(t)} for name, t in times.items()
    }
    base = results["none"]["us_per_step"]
    for r in results.values():
        r["overhead_pct"] = 100.0 * (r["us_per_step"] - base) / base
    meta = {
        "device": args.device, "systems": args.systems, "atoms": args.atoms, "steps": args.steps,
        "torch": torch.__version__,
    }
    if args.json:
        print(json.dumps({"meta": meta, "results": results, "host_us_per_call": per_call}, indent=2))
        return
    print(f"bench_hooks: {meta}")
    print(f"{'case':<22} {'us/step':>10} {'median':>10} {'overhead':>9}")
    for name, r in results.items():
        print(f"{name:<22} {r['us_per_step']:>10.1f} {r['median_us']:>10.1f} {r['overhead_pct']:>8.1f}%")
    print(f"{'hook call':<22} {'host us':>10}")
    for name, us in per_call.items():
        print(f"{name:<22} {us:>10.1f}")


if __name__ == "__main__":
    main()
