"""W5 of BENCHMARKS.md: dynamics with a snapshot of every system every N steps to a Zarr store.

Runs the same dynamics three times per repeat: without snapshots, with a synchronous
``ZarrData`` and with an asynchronous one, and prints the median ms/step of each and the
slowdown against no snapshots (target: <= 5 % asynchronous). Every snapshot is then read back
and counted: the number of records must be snapshots x systems, each ``system_id`` as often.

The workload is W1's: FCC argon 3x3x3 (108 atoms) x 2048 systems, float32, LJ + Langevin 50 K
(``model:lennard-jones`` and ``integrator:langevin`` when those plugins are installed). Without
them it says so and runs DemoModelWrapper + DemoDynamics (all-pairs Morse, velocity Verlet),
which measures the same thing: how much of a write the loop sees.

    python plugins/alchemi-zarr/benchmarks/sink_overlap.py --steps 1000 --every 100 --json w5.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from alchemi_core import registry
from alchemi_core.data import AtomicData, Batch
from alchemi_core.dynamics import DemoDynamics, Hook
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_zarr import AtomicDataZarrReader, ZarrData


class Snapshot(Hook):
    """Writes the whole batch to a sink every ``frequency`` steps."""

    def __init__(self, sink: ZarrData, frequency: int) -> None:
        super().__init__(frequency=frequency)
        self.sink = sink

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        self.sink.write(batch)


def argon_batch(n_systems: int, device: str, seed: int = 0) -> Batch:
    a = 5.26
    basis = torch.tensor([[0, 0, 0], [0, 0.5, 0.5], [0.5, 0, 0.5], [0.5, 0.5, 0]], dtype=torch.float32)
    cells = torch.stack(torch.meshgrid(*[torch.arange(3.0)] * 3, indexing="ij"), -1).reshape(-1, 1, 3)
    lattice = ((cells + basis).reshape(-1, 3) * a)  # 108 atoms
    g = torch.Generator().manual_seed(seed)
    structures = [
        AtomicData(
            atomic_numbers=torch.full((108,), 18, dtype=torch.long),
            positions=lattice + 0.05 * torch.randn(108, 3, generator=g),
            cell=torch.eye(3) * 3 * a,
            pbc=torch.tensor([True, True, True]),
        )
        for _ in range(n_systems)
    ]
    batch = Batch.from_data_list(structures, device=device)
    batch.set_field("system_id", torch.arange(n_systems, device=device), "system")
    return batch


def make_dynamics(steps: int, hooks: list[Hook]) -> tuple[Any, str]:
    try:
        model = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5125)
        dyn = registry.build("integrator:langevin", model=model, n_steps=steps, dt=5.0, temperature=50.0,
                             friction=0.01, hooks=hooks)
        return dyn, "lennard-jones + langevin"
    except Exception as exc:  # noqa: BLE001 - any missing plugin or signature: fall back, and say so
        return DemoDynamics(model=DemoModelWrapper(), n_steps=steps, dt=1.0, hooks=hooks), f"demo (fallback: {exc!r:.80})"


def run_once(mode: str, args: argparse.Namespace, root: Path) -> tuple[float, str, int]:
    batch = argon_batch(args.systems, args.device)
    store = root / f"{mode}.zarr"
    shutil.rmtree(store, ignore_errors=True)
    sink = None if mode == "none" else ZarrData(str(store), asynchronous=mode == "async")
    hooks = [] if sink is None else [Snapshot(sink, args.every)]
    dyn, what = make_dynamics(args.steps, hooks)
    if args.device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    dyn.run(batch)
    if args.device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start  # what the dynamics loop saw
    records = 0
    if sink is not None:
        sink.close()
        reader = AtomicDataZarrReader(str(store))
        records = len(reader)
        ids = reader.read_batch(0, records).system_id
        counts = torch.bincount(ids, minlength=args.systems)
        assert bool((counts == counts[0]).all()), "every system must appear in every snapshot"
    return elapsed / args.steps * 1e3, what, records


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--systems", type=int, default=2048)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--every", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dir", default=None, help="where the stores go (default: a temporary folder)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="alchemi-w5-"))
    run_once("none", argparse.Namespace(**{**vars(args), "steps": min(args.steps, 50)}), root)  # warm-up
    times: dict[str, list[float]] = {"none": [], "sync": [], "async": []}
    workload, records = "", {}
    for _ in range(args.repeats):
        for mode in times:
            ms, workload, n = run_once(mode, args, root)
            times[mode].append(ms)
            records[mode] = n
    expected = (args.steps // args.every) * args.systems
    base = statistics.median(times["none"])
    rows = []
    print(f"W5: {args.systems} systems x 108 atoms, {args.steps} steps, snapshot every {args.every}; {workload}")
    print(f"{'sink':<8} {'ms/step':>9} {'slowdown':>9} {'records':>9}")
    for mode, values in times.items():
        ms = statistics.median(values)
        slowdown = (ms / base - 1) * 100
        print(f"{mode:<8} {ms:9.3f} {slowdown:8.1f}% {records[mode]:9d}")
        rows.append({"sink": mode, "ms_per_step": ms, "slowdown_percent": slowdown, "records": records[mode]})
    for mode in ("sync", "async"):
        assert records[mode] == expected, f"{mode}: {records[mode]} records, expected {expected}"
    print(f"records check: {expected} per store, every system_id equally often: ok")
    if args.json:
        Path(args.json).write_text(json.dumps({"workload": workload, "args": vars(args), "rows": rows}, indent=2))
    shutil.rmtree(root, ignore_errors=True) if args.dir is None else None


if __name__ == "__main__":
    main()
