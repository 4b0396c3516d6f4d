"""W3's checks and the sampler's prefetch: was the GPU still busy when a check's read-back began,
how long the host built structures meanwhile and then waited, and how many structures were ready
when a refill asked for them (alchemi only, GPU).

The engine's read-back (``alchemi_core.dynamics.readback.FlagReadBack.read``) and the sampler's
``_load`` are wrapped to count; the run is otherwise the benchmark's (after one untimed run of 64
other cells).

Example:
    python -m benchmarks.w3_prefetch --cells 10000 --json w3_prefetch.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import spec
from benchmarks.report import print_report


def _instrument() -> tuple[list[tuple[bool, int, float, float]], list[int]]:
    """Wrap the read-back and the sampler's loads; returns their records (filled as they run)."""
    from alchemi_core.dynamics import readback
    from alchemi_core.dynamics import sampler as sampler_module

    checks: list[tuple[bool, int, float, float]] = []  # busy at start, structures built, build s, wait s
    ready = [0, 0]  # requested structures that were ready, that were not

    def read(self: Any, flags: torch.Tensor, idle: Any = None) -> list[Any]:
        host, event = self.start(flags)
        busy, built, t0 = not event.query(), 0, time.perf_counter()
        while idle is not None and not event.query() and idle():
            built += 1
        t1 = time.perf_counter()
        event.synchronize()
        checks.append((busy, built, t1 - t0, time.perf_counter() - t1))
        return host.tolist()

    plain_load = sampler_module.SizeAwareSampler._load

    def load(self: Any, index: int, stored: bool = False) -> Any:
        ready[0 if (index, stored) in self._ready else 1] += 1
        return plain_load(self, index, stored)

    readback.FlagReadBack.read = read  # type: ignore[method-assign]
    sampler_module.SizeAwareSampler._load = load  # type: ignore[method-assign]
    return checks, ready


def run(cells: int) -> dict[str, Any]:
    from benchmarks.adapters.alchemi import Alchemi
    from benchmarks.structures import ArgonCells

    framework = Alchemi()
    framework.inflight(ArgonCells.drawn(64, spec.W3_REPEATS, seed=1), "cuda", spec.W3_MD_STEPS, None)
    checks, ready = _instrument()
    outcome = framework.inflight(ArgonCells.drawn(cells, spec.W3_REPEATS), "cuda", spec.W3_MD_STEPS, None)
    waits = sorted(c[3] for c in checks)
    return {
        "cells": cells,
        "seconds": outcome.seconds,
        "structures_out": len(outcome.ids_out),
        "converged": outcome.converged,
        "checks": len(checks),
        "gpu_busy_at_read_back": sum(c[0] for c in checks),
        "structures_built_while_waiting": sum(c[1] for c in checks),
        "building_s": sum(c[2] for c in checks),
        "waiting_s": sum(c[3] for c in checks),
        "wait_ms_median": 1e3 * waits[len(waits) // 2] if waits else None,
        "ready_when_requested": ready[0],
        "built_when_requested": ready[1],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=spec.W3_CELLS)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.w3_prefetch needs a CUDA GPU (it times the waits for one)")
    report = run(args.cells)
    return print_report(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
