"""Quarantine at scale: 1,000 structures of which 1 % explode (their model returns NaN).

The run must finish with 990 structures graduated and 10 quarantined, each with its reason, at a
step rate within 2 % of the same run without explosions (both runs use the same model wrapper,
whose NaN masks are computed either way, so only the quarantine itself differs). Quarantine is
checked at check steps only, on the device, reading back one byte per system.

Each structure finishes after its own number of steps (20 to 40, as relaxations converge at
different steps), so refills come a few systems at a time in both runs. With one budget for all,
the clean run would refill whole batches at once, and every structure leaving early (exploded or
converged) would split that cadence into more, smaller refills, each with its own model forward:
a cost of inflight batching, not of quarantine.

Run (CPU, or the H200 with ``--device cuda``), from the repository root::

    python -m tools.quarantine --device cuda --out quarantine.json

It prints one JSON object and exits 1 when a condition fails. Repeats alternate the two runs and
the median step rate of each is compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import ConvergenceHook, DemoDynamics, HostMemory, SizeAwareSampler
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import random_structures
from alchemi_core.testing.exploding import ExplodingModel


class FinishesAtItsOwnStep(ConvergenceHook):
    """Converged once a structure has taken ``steps_needed`` steps (a per-structure field)."""

    def evaluate(self, batch):
        return batch.stage_steps >= batch.steps_needed.reshape(-1)


def inputs(count: int, n_steps: int) -> tuple[list, list[int]]:
    """The structures (4-8 atoms, each finishing after its own 20-40 steps for ``n_steps=40``)
    and the indices of the 1 % that explode."""
    structures = random_structures([4 + (i * 7) % 5 for i in range(count)], dtype=torch.float32)
    for i, s in enumerate(structures):
        s.steps_needed = torch.tensor([n_steps // 2 + (i * 7919) % (n_steps // 2 + 1)])
    return structures, list(range(7, count, 100))[: max(1, count // 100)]


def _run(structures: list, explode: list[int], device: str, batch_size: int, n_steps: int, every: int) -> dict:
    dataset = ListDataset(structures, device=device)
    sampler = SizeAwareSampler(dataset, max_atoms=batch_size * 8, max_batch_size=batch_size, bin_width=1)
    sink = HostMemory(capacity=None)
    model = ExplodingModel(DemoModelWrapper(), explode=explode, after=5)
    own_step = FinishesAtItsOwnStep(criteria=[{"key": "steps_needed", "threshold": 0.0}], frequency=every)
    stage = DemoDynamics(model=model, n_steps=n_steps, dt=0.5, sampler=sampler, sinks=[sink],
                         refill_frequency=every, convergence_hook=own_step)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    stage.run()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    out = sink.read()
    status = out.status.tolist()
    return {
        "seconds": seconds,
        "steps": stage.step_count,
        "steps_per_s": stage.step_count / seconds,
        "stored": len(status),
        "distinct_ids": len(set(out.system_id.tolist())),
        "graduated": sum(1 for s in status if s == 1),
        "quarantined": sum(1 for s in status if s < 0),
        "reasons": {q.system_id: q.reason for q in stage.quarantined},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--structures", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--n-steps", type=int, default=40)
    parser.add_argument("--check-every", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(1)
    structures, explode = inputs(args.structures, args.n_steps)
    _run(structures[:128], [], args.device, args.batch_size, 10, args.check_every)  # warm-up
    runs: dict[str, list[dict[str, Any]]] = {"clean": [], "exploding": []}
    for _ in range(args.repeats):
        runs["clean"].append(_run(structures, [], args.device, args.batch_size, args.n_steps, args.check_every))
        runs["exploding"].append(_run(structures, explode, args.device, args.batch_size, args.n_steps,
                                      args.check_every))
    rate = {k: statistics.median(r["steps_per_s"] for r in v) for k, v in runs.items()}
    last = runs["exploding"][-1]
    ratio = rate["exploding"] / rate["clean"]
    checks = {
        "every structure stored once": last["stored"] == args.structures == last["distinct_ids"],
        "graduated": last["graduated"] == args.structures - len(explode),
        "quarantined": last["quarantined"] == len(explode) and sorted(last["reasons"]) == explode,
        "each with its reason": all("forces are not finite" in r for r in last["reasons"].values()),
        "step rate within tolerance": ratio >= 1.0 - args.tolerance,
    }
    report = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "structures": args.structures,
        "exploding": explode,
        "steps_per_s": rate,
        "rate_ratio_exploding_over_clean": ratio,
        "graduated": last["graduated"],
        "quarantined": last["quarantined"],
        "reasons": {str(k): v for k, v in last["reasons"].items()},
        "runs": {k: [{x: r[x] for x in ("seconds", "steps", "steps_per_s")} for r in v] for k, v in runs.items()},
        "checks": checks,
        "ok": all(checks.values()),
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
