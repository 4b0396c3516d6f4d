"""A small data-parallel campaign for the tests: relax (budget) then NVE MD on the demo model,
24 structures of 2-9 atoms in float64, written to a sharded Zarr store.

Used two ways: ``job(backend, ...)`` runs on every rank of a ``RankPool`` group; run as a script
(one process per rank, torchrun's environment), it joins ``comm:gloo`` itself, and prints one
line of JSON with its summary or its error.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

import torch

from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import DemoDynamics, Hook, SizeAwareSampler
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.parallel import DataParallelError, RankContext, run_data_parallel
from alchemi_core.testing import random_structures

SIZES = [2 + (7 * i) % 8 for i in range(24)]
RELAX_STEPS, MD_STEPS = 30, 20


def dataset() -> ListDataset:
    return ListDataset(random_structures(SIZES, dtype=torch.float64, spread=1.2))


class Fail(Hook):
    """Kill this process (``kill``) or raise (``raise``) at a step: a failing rank."""

    def __init__(self, how: str, at_step: int) -> None:
        super().__init__(frequency=1)
        self.how, self.at_step, self.steps = how, at_step, 0

    def __call__(self, batch: Any, dynamics: Any) -> None:
        self.steps += 1
        if self.steps == self.at_step:
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected failure at step {self.steps}")


#: Where this process's ranks ran (make_run records ctx.device).
DEVICES: list[str] = []


def make_run_factory(fail_rank: int | None = None, how: str = "kill", at_step: int = 60) -> Any:
    def make_run(ctx: RankContext) -> Any:
        DEVICES.append(str(ctx.device))
        model = DemoModelWrapper()
        sampler = SizeAwareSampler(ctx.dataset, max_atoms=24, max_batch_size=4, bin_width=2)
        relax = DemoDynamics(model=model, n_steps=RELAX_STEPS, dt=0.5, sampler=sampler)
        md = DemoDynamics(model=model, n_steps=MD_STEPS, dt=0.5, sinks=[ctx.sink])
        fused = relax + md
        if fail_rank == ctx.rank:
            fused.hooks.append(Fail(how, at_step))
        return fused

    return make_run


def store(root: str) -> Any:
    from alchemi_zarr import ShardedZarrStore

    return ShardedZarrStore(root)


def job(backend: Any, root: str, fail_rank: int | None = None, how: str = "kill") -> dict[str, Any]:
    """One rank of a RankPool group: the summary, or the error's details."""
    try:
        s = run_data_parallel(make_run_factory(fail_rank, how), dataset(), store(root), backend=backend)
    except DataParallelError as exc:
        return {"error": str(exc), "failed_rank": exc.failed_rank, "unfinished": exc.unfinished}
    return {"ran": s.ran, "skipped": s.skipped, "complete": s.complete, "committed": s.committed,
            "missing": list(s.missing), "duplicated": list(s.duplicated)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--how", default="kill")
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args()
    try:
        s = run_data_parallel(make_run_factory(args.fail_rank, args.how), dataset(), store(args.root),
                              timeout_s=args.timeout)
    except DataParallelError as exc:
        print(json.dumps({"error": str(exc), "failed_rank": exc.failed_rank,
                          "unfinished": {str(k): v for k, v in exc.unfinished.items()}}), flush=True)
        return 3
    print(json.dumps({"ran": s.ran, "complete": s.complete, "devices": DEVICES}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
