"""What building W3's cells costs the engine's process, with and without sampler workers.

A ``SizeAwareSampler`` over W3's cells (made on request, as ``CellDataset`` does) is drained the
way an inflight run's refills drain it: the initial batch, then requests of ``--request``
structures, each after a few calls of ``prefetch`` (as while a check waits for a GPU). For each
number of workers it reports, per structure, the wall time and the CPU time of this process
(``time.process_time``: its threads, not the workers), in alternating rounds. Where the host has
GPU work to overlap, the CPU time is what the run's host pays.

    python -m benchmarks.sampler_workers --cells 6000 --workers 0,2 --rounds 2

Example:
    >>> drain(structures=40, workers=0, request=8)["structures"]
    40
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from benchmarks import spec


def drain(structures: int, workers: int, request: int) -> dict[str, Any]:
    """Drain a sampler over ``structures`` W3 cells; times per structure in ms."""
    from alchemi_core.dynamics import SizeAwareSampler
    from benchmarks.alchemi_parts import CellDataset
    from benchmarks.structures import ArgonCells

    sampler = SizeAwareSampler(CellDataset(ArgonCells.drawn(structures, spec.W3_REPEATS)),
                               max_atoms=spec.W3_MAX_ATOMS, bin_width=32, workers=workers)
    wall, cpu = time.perf_counter(), time.process_time()
    count = sampler.build_initial_batch().num_graphs
    while not sampler.exhausted:
        for _ in range(4):
            sampler.prefetch()
        batch = sampler.request_batch(request, request * 900, None)
        count += 0 if batch is None else batch.num_graphs
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    sampler.close()
    return {"workers": workers, "structures": count, "wall_ms_each": 1e3 * wall / count,
            "process_cpu_ms_each": 1e3 * cpu / count}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sampler_workers", description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=6000)
    parser.add_argument("--workers", default="0,2", help="comma-separated numbers of workers")
    parser.add_argument("--request", type=int, default=60, help="structures per refill request")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    rows = [drain(args.cells, int(w), args.request) for _ in range(args.rounds) for w in args.workers.split(",")]
    print(json.dumps({"cells": args.cells, "request": args.request, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
