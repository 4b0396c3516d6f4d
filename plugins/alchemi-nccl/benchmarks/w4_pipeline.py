"""W4 of BENCHMARKS.md: W3's relax-then-MD workload as a two-rank ``DistributedPipeline``.

Rank 0 relaxes (FIRE from alchemi-integrators, else ``DemoDynamics``) structures fed by a
``SizeAwareSampler``; every structure that converged (or used its relaxation budget) moves to
rank 1 for NVT MD (Langevin from alchemi-integrators, else ``DemoDynamics``). The model is
Lennard-Jones argon from alchemi-potentials, else ``DemoModelWrapper``. The script prints which
it used, the throughput, and the checks that go with every figure: structures out = in (each
``system_id`` once), and how many the relaxation released at or below the force threshold
(the others used its step budget).

On two GPUs (NCCL)::

    torchrun --nproc-per-node=2 plugins/alchemi-nccl/benchmarks/w4_pipeline.py --json w4.json

The W3 baseline on one GPU (the same stages fused), for W4's speed-up::

    python plugins/alchemi-nccl/benchmarks/w4_pipeline.py --fused --json w3.json

A quick check on CPUs (gloo, a handful of small cells)::

    torchrun --nproc-per-node=2 plugins/alchemi-nccl/benchmarks/w4_pipeline.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from alchemi_core import registry
from alchemi_core.dynamics import (
    ConvergenceHook,
    DemoDynamics,
    DistributedPipeline,
)
from alchemi_core.dynamics.base import BufferConfig
from alchemi_core.dynamics.sampler import SizeAwareSampler

# W3's cells, the id tally and the converged count are the benchmark harness's (benchmarks/ at
# the repository root), so W3 here and in `python -m benchmarks` are the same structures.
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks import spec  # noqa: E402
from benchmarks.alchemi_parts import CellDataset, ConvergedCount, IdTallySink  # noqa: E402
from benchmarks.structures import ArgonCells  # noqa: E402

ARGON = {"epsilon": spec.EPSILON, "sigma": spec.SIGMA, "cutoff": spec.CUTOFF}


def has(component: str) -> bool:
    kind = component.split(":")[0]
    return any(r.spec == component for r in registry.available(kind))


def make_model(dtype: torch.dtype) -> tuple[Any, str]:
    if has("model:lennard-jones"):
        return registry.build("model:lennard-jones", **ARGON), "lennard-jones (alchemi-potentials)"
    from alchemi_core.models.demo import DemoModelWrapper

    return DemoModelWrapper(), "demo (all pairs; install alchemi-potentials for W4's LJ argon)"


def make_stages(
    args: argparse.Namespace, model: Any, count: int
) -> tuple[Any, Any, IdTallySink, ConvergedCount, dict[str, str]]:
    conv = ConvergenceHook.from_fmax(args.fmax, frequency=args.check_every)
    buffer = BufferConfig(num_systems=args.buffer_systems, num_nodes=args.buffer_atoms, num_edges=0)
    common = {"comm_mode": args.comm_mode, "buffer_config": buffer}
    dataset = CellDataset(ArgonCells.drawn(count, args.repeats), dtype=args.torch_dtype)
    sampler = SizeAwareSampler(dataset, max_atoms=args.max_atoms, max_batch_size=args.max_batch, bin_width=32)
    converged = ConvergedCount()
    relax_kw = {"model": model, "n_steps": args.relax_steps, "convergence_hook": conv, "sampler": sampler,
                "refill_frequency": args.check_every, "hooks": [converged], **common}
    if has("integrator:fire"):
        relax, relax_name = registry.build("integrator:fire", dt=args.fire_dt, **relax_kw), "fire"
    else:
        relax, relax_name = DemoDynamics(dt=args.fire_dt, **relax_kw), "demo (NVE; install alchemi-integrators for FIRE)"
    tally = IdTallySink()
    md_kw = {"model": model, "n_steps": args.md_steps, "sinks": [tally], "refill_frequency": args.check_every, **common}
    if has("integrator:langevin"):
        md = registry.build("integrator:langevin", dt=5.0, temperature=50.0, friction=0.01, **md_kw)
        md_name = "langevin 50 K"
    else:
        md, md_name = DemoDynamics(dt=5.0, **md_kw), "demo (NVE; install alchemi-integrators for Langevin)"
    return relax, md, tally, converged, {"relax": relax_name, "md": md_name}


def report(args: argparse.Namespace, result: dict[str, Any]) -> None:
    line = (f"{result['workload']} {result['mode']}: {result['structures_out']}/{result['structures_in']} structures "
            f"in {result['seconds']:.2f} s = {result['structures_per_hour']:.3g} structures/h "
            f"({result['converged']} converged to fmax <= {args.fmax}, the others used the "
            f"{args.relax_steps}-step budget); "
            f"model {result['model']}, relax {result['relax']}, md {result['md']}")
    print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


def summarise(
    args: argparse.Namespace, mode: str, seconds: float, tally: IdTallySink, converged: int, names: dict[str, str], count: int
) -> dict[str, Any]:
    ids = tally.all_ids()
    if len(ids) != count or len(np.unique(ids)) != count:
        raise SystemExit(f"accounting failed: {len(ids)} structures out ({len(np.unique(ids))} distinct) of {count}")
    return {
        "workload": "W4" if mode == "pipeline" else "W3", "mode": mode, "structures_in": count,
        "structures_out": int(len(ids)), "converged": converged, "seconds": seconds,
        "structures_per_hour": 3600.0 * count / seconds, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        **names, "comm_mode": args.comm_mode, "dtype": args.dtype, "md_steps": args.md_steps,
        "check_every": args.check_every, "queue_depth": args.queue_depth,
    }


def run_fused(args: argparse.Namespace, device: torch.device) -> None:
    model, model_name = make_model(args.torch_dtype)
    for count, timed in ((args.warmup, False), (args.structures, True)):
        if not count:
            continue
        relax, md, tally, converged, names = make_stages(args, model, count)
        fused = relax + md
        first = relax.sampler.build_initial_batch().to(device)
        sync(device)
        start = time.perf_counter()
        fused.run(first)
        sync(device)
        if timed:
            seconds = time.perf_counter() - start
            report(args, summarise(args, "fused", seconds, tally, converged.count, {"model": model_name, **names}, count))


def run_pipeline(args: argparse.Namespace) -> None:
    spec = args.backend or ("comm:nccl" if torch.cuda.is_available() else "comm:gloo")
    backend = registry.build(spec, timeout_s=args.timeout)
    backend.init()
    rank = backend.rank
    device = backend.device if backend.device.type == "cuda" else torch.device("cpu")
    model, model_name = make_model(args.torch_dtype)
    try:
        for count, timed in ((args.warmup, False), (args.structures, True)):
            if not count:
                continue
            relax, md, tally, converged, names = make_stages(args, model, count)
            pipeline = DistributedPipeline({0: relax, 1: md}, backend=backend, timeout_s=args.timeout, device=device,
                                           queue_depth=args.queue_depth)
            backend.barrier()
            start = time.perf_counter()
            pipeline.run()
            sync(device)
            seconds = time.perf_counter() - start
            total_converged = backend.all_reduce_sum(converged.count)  # counted on rank 0
            if timed and rank == 1:
                names = {"model": model_name, **names, "backend": spec}
                report(args, summarise(args, "pipeline", seconds, tally, total_converged, names, count))
            elif timed:
                stats = relax.pipeline_rank
                print(f"rank 0: relaxed and sent {stats.left} structures in {seconds:.2f} s "
                      f"({stats.held_back} waits for room in the send buffer)", flush=True)
    finally:
        backend.shutdown()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fused", action="store_true", help="W3: both stages fused on one device (no torchrun)")
    p.add_argument("--smoke", action="store_true", help="a few 32-atom cells, short stages (CPU check)")
    p.add_argument("--structures", type=int, default=10_000)
    p.add_argument("--warmup", type=int, default=64, help="structures run first, untimed (kernel compilation)")
    p.add_argument("--md-steps", type=int, default=500)
    p.add_argument("--relax-steps", type=int, default=2000, help="FIRE budget per structure")
    p.add_argument("--fmax", type=float, default=0.05)
    p.add_argument("--fire-dt", type=float, default=1.0, help="fs")
    p.add_argument("--check-every", type=int, default=5, help="steps between convergence/refill checks")
    p.add_argument("--max-atoms", type=int, default=250_000, help="atoms per batch (sampler budget), both modes")
    p.add_argument("--max-batch", type=int, default=1024, help="most structures per batch")
    p.add_argument("--buffer-systems", type=int, default=128)
    p.add_argument("--buffer-atoms", type=int, default=128 * 864)
    p.add_argument("--comm-mode", default="fully_async", choices=["sync", "async_recv", "fully_async"])
    p.add_argument("--backend", default=None, help="comm:nccl (default on GPUs) or comm:gloo")
    p.add_argument("--queue-depth", type=int, default=4, help="fully_async: sends in flight before a rank waits")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a rank waits for its peer")
    p.add_argument("--json", default=None, help="also write the result here (rank 1 / fused)")
    args = p.parse_args(argv)
    args.repeats = spec.W3_REPEATS
    if args.smoke:
        args.structures, args.warmup, args.md_steps, args.relax_steps = 12, 0, 20, 30
        args.repeats, args.max_atoms, args.max_batch = (2,), 4 * 32, 4
        args.buffer_systems, args.buffer_atoms = 2, 64
    args.torch_dtype = getattr(torch, args.dtype)
    if args.fused:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        run_fused(args, device)
    elif "RANK" in os.environ:
        if int(os.environ["WORLD_SIZE"]) != 2:
            sys.exit("W4 runs on two ranks: torchrun --nproc-per-node=2 ...")
        run_pipeline(args)
    else:
        sys.exit("launch with torchrun --nproc-per-node=2 (or pass --fused for the one-device baseline)")


if __name__ == "__main__":
    main()
