"""W3 data parallel: BENCHMARKS.md's W3 workload (argon cells of 4 n³ atoms, n from {2, 3, 4, 6},
FIRE to 0.05 eV/Å then 500 Langevin NVT steps, a fused inflight stage fed by
``SizeAwareSampler``) on every GPU at once, each on its shard, into one sharded Zarr store.

The stages and their parameters are those of the W3 harness (``benchmarks.adapters.alchemi``):
the same cells, FIRE as ASE runs it, the Langevin thermostat of W1, checks every 5 steps, at
most ``spec.W3_MAX_ATOMS`` atoms per batch. Each rank first runs a few cells untimed (kernel
compilation and CUDA graph capture), then the timed run: ``run_data_parallel`` from the start
(store read, agreement) to the slowest rank's last write, with the store checked by rank 0
(every cell once). Rank 0 prints one line and, with ``--json``, a record.

One, two and four GPUs of a host (the speed-up is the 1-GPU time over the N-GPU time)::

    torchrun --nproc-per-node=1 benchmarks/w3_data_parallel.py --cells 40000 --json dp1.json
    torchrun --nproc-per-node=2 benchmarks/w3_data_parallel.py --cells 40000 --json dp2.json
    torchrun --nproc-per-node=4 benchmarks/w3_data_parallel.py --cells 40000 --json dp4.json

A quick check on CPUs::

    torchrun --nproc-per-node=2 benchmarks/w3_data_parallel.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import spec  # noqa: E402
from benchmarks.alchemi_parts import CellDataset, ConvergedCount, IdTallySink  # noqa: E402
from benchmarks.structures import ArgonCells  # noqa: E402

CHECK_EVERY = 5


def make_stages(dataset: Any, device: torch.device, md_steps: int, relax_steps: int, sinks: list[Any],
                max_atoms: int) -> tuple[Any, ConvergedCount]:
    from alchemi_core.dynamics import ConvergenceHook, FusedStage, SizeAwareSampler
    from alchemi_integrators import FIRE, Langevin
    from alchemi_potentials import LennardJones

    f, p = spec.FIRE, spec.LANGEVIN
    model = LennardJones(spec.EPSILON, spec.SIGMA, spec.CUTOFF, skin=spec.SKIN,
                         max_neighbors=spec.neighbor_columns(spec.CUTOFF + spec.SKIN, headroom=1.3))
    sampler = SizeAwareSampler(dataset, max_atoms=max_atoms, bin_width=32)
    converged = ConvergedCount()
    relax = FIRE(model, n_steps=relax_steps, dt=f.dt_fs, dt_max=f.dt_max_fs, maxstep=f.maxstep,
                 maxstep_scope="system", sampler=sampler, refill_frequency=CHECK_EVERY, hooks=[converged],
                 convergence_hook=ConvergenceHook.from_fmax(f.fmax, frequency=CHECK_EVERY))
    md = Langevin(model, n_steps=md_steps, dt=p.dt_fs, temperature=p.temperature, friction=p.friction_per_fs,
                  random_seed=0, sinks=sinks, refill_frequency=CHECK_EVERY)
    fused = FusedStage([(0, relax), (1, md)])
    if device.type == "cuda":
        fused = fused.compile()
    return fused, converged


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", type=int, default=40_000)
    p.add_argument("--warmup", type=int, default=64, help="cells each rank runs first, untimed")
    p.add_argument("--md-steps", type=int, default=spec.W3_MD_STEPS)
    p.add_argument("--relax-steps", type=int, default=spec.W3_RELAX_BUDGET)
    p.add_argument("--max-atoms", type=int, default=spec.W3_MAX_ATOMS)
    p.add_argument("--store", default=None, help="the results root (default: w3dp-CELLS-xRANKS.zarr here, "
                   "removed at the end; on several hosts a path all of them reach)")
    p.add_argument("--keep", action="store_true", help="keep the results store")
    p.add_argument("--smoke", action="store_true", help="a few small cells, short stages (CPU check)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    repeats: tuple[int, ...] = spec.W3_REPEATS
    if args.smoke:
        args.cells, args.warmup, args.md_steps, args.relax_steps, args.max_atoms = 16, 0, 20, 30, 4 * 32
        repeats = (2,)

    from alchemi_core.parallel import RankContext, rank_device, run_data_parallel
    from alchemi_zarr import ShardedZarrStore

    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = rank_device(int(os.environ.get("LOCAL_RANK", "0")))
    root = args.store or f"w3dp-{args.cells}-x{world}.zarr"
    results = ShardedZarrStore(root, asynchronous=True)
    if results.committed_count():  # every rank looks before any writes (run_data_parallel's barrier)
        raise SystemExit(f"{root} already holds results; remove it (this benchmark times a whole run)")
    if args.warmup:  # untimed: the kernels compile, the graphs are captured once per shape
        warm = CellDataset(ArgonCells.drawn(args.warmup, repeats, seed=1))
        stage, _ = make_stages(warm, device, 20, 20, [IdTallySink()], args.max_atoms)
        stage.run(stage.sampler.build_initial_batch(device))
    cells = ArgonCells.drawn(args.cells, repeats)
    converged: list[int] = []

    def make_run(ctx: RankContext) -> None:
        stage, count = make_stages(ctx.dataset, ctx.device, args.md_steps, args.relax_steps, [ctx.sink],
                                   args.max_atoms)
        stage.hooks.append(ctx.watch)
        stage.run(stage.sampler.build_initial_batch(ctx.device))
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        converged.append(count.count)

    summary = run_data_parallel(make_run, CellDataset(cells), results, timeout_s=1800.0, device=device)
    seconds = summary.wall_s
    if summary.rank == 0:
        atoms = int(cells.atom_counts().sum())
        record = {
            "workload": "W3 data parallel", "ranks": summary.world_size, "cells": args.cells, "atoms": atoms,
            "seconds": seconds, "structures_per_hour": 3600.0 * summary.ran / seconds,
            "complete": summary.complete, "stored": summary.committed, "missing": len(summary.missing),
            "duplicated": len(summary.duplicated), "converged_on_rank_0": int(np.sum(converged)),
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "md_steps": args.md_steps,
        }
        print(f"W3 data parallel on {summary.world_size} ranks: {summary.ran} cells ({atoms:,} atoms) in "
              f"{seconds:.2f} s = {record['structures_per_hour']:.3g} structures/h; store complete: "
              f"{summary.complete} ({summary.committed} records)", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(record, indent=2))
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        if not summary.complete:
            raise SystemExit("accounting failed: the store does not hold every cell exactly once")


if __name__ == "__main__":
    main()
