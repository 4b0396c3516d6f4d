"""W2 run again and again in one process: device allocations and reserved memory per run.

A user relaxing chunk after chunk (or a benchmark's repeats) runs many engines one after another
in one process. Each run should find the memory of the run before in torch's cache; where it
does not, every run asks the driver again (``cudaMalloc``, host time the GPU waits for) and torch's
reserved memory grows. This runs W2's relaxation (``--cells`` cells of 108 argon atoms) once
untimed and then ``--runs`` times, every other run after ``gc.collect()``, and reports per run its
wall time, the device allocations torch made (``num_device_alloc``), the memory it reserves after,
and how many stages (``BaseDynamics``) are still alive after it, none of them in use: an ended
run's stage that only Python's cycle collector would free shows there (before the engine held
its stages weakly, a loop of FIRE runs kept up to 15 alive). On a CPU the allocation columns are
empty.

    python -m tools.repeat_memory --runs 8 --json out.json

Example:
    >>> _device_stats("cpu")
    (None, None)
"""

from __future__ import annotations

import argparse
import gc
import json
from typing import Any

import torch


def _device_stats(device: str) -> tuple[int | None, int | None]:
    """Device allocations so far and reserved MiB (None, None on a CPU)."""
    if not device.startswith("cuda"):
        return None, None
    torch.cuda.synchronize()
    return int(torch.cuda.memory_stats()["num_device_alloc"]), torch.cuda.memory_reserved() // 2**20


def stages_alive() -> int:
    """Stages Python still holds, reachable or not (the collector's list of every object)."""
    from alchemi_core.dynamics.base import BaseDynamics

    return sum(issubclass(type(o), BaseDynamics) for o in gc.get_objects())  # type(): no proxy asked


def measure(cells: int, runs: int, device: str) -> list[dict[str, Any]]:
    """One row per run (after one untimed run): seconds, steps, allocations, reserved MiB."""
    from benchmarks.adapters.alchemi import Alchemi
    from benchmarks.structures import ArgonCells

    systems = ArgonCells([3] * cells).systems()
    framework = Alchemi()
    framework.relax(systems, device, 2000, None)
    rows = []
    for i in range(runs):
        collect = i % 2 == 1
        if collect:
            gc.collect()
        before, _ = _device_stats(device)
        outcome = framework.relax(systems, device, 2000, None)
        after, reserved = _device_stats(device)
        rows.append({
            "gc_first": collect, "seconds": round(outcome.seconds, 5), "steps": outcome.steps,
            "device_allocs": None if before is None or after is None else after - before, "reserved_MiB": reserved,
            "stages_alive": stages_alive(),
        })
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", type=int, default=2048)
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rows = measure(args.cells, args.runs, args.device)
    print(f"{'run':>3}  {'gc first':>8}  {'seconds':>8}  {'steps':>5}  {'allocations':>11}  {'reserved MiB':>12}  "
          f"{'stages alive':>12}")
    for i, r in enumerate(rows):
        print(f"{i:>3}  {r['gc_first']!s:>8}  {r['seconds']:>8.4f}  {r['steps']:>5}  "
              f"{r['device_allocs']!s:>11}  {r['reserved_MiB']!s:>12}  {r['stages_alive']:>12}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cells": args.cells, "device": args.device, "runs": rows}, f, indent=1)


if __name__ == "__main__":
    main()
