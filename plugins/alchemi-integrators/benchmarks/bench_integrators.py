"""Time one step of each integrator, torch path against Warp kernels, on the W1 shapes.

The model is a stand-in that returns the forces already in the batch (no work), so the time is
the integrator's plus the engine's per-step bookkeeping: the cost an integrator adds to a real
step. Each figure is the median of ``--repeats`` timed runs of ``--steps`` steps, after a
warm-up run (Warp compiles and records its launches there); on CUDA the clock waits for the
device. Peak device memory per atom is reported for the Langevin run (batch + integrator).

Usage (GPU machine)::

    python plugins/alchemi-integrators/benchmarks/bench_integrators.py --device cuda --dtype float32 \\
        --json integrators_gpu.json

    python plugins/alchemi-integrators/benchmarks/bench_integrators.py --device cpu --shapes 108x64 864x1

Prints one row per (shape, integrator): µs per step for torch and Warp, atom-steps/s of the
faster, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from alchemi_core.data import AtomicData, Batch

SHAPES = ("108x1", "108x2048", "256x1024", "55296x1")


class NoForces:
    """Returns the batch's own energy and forces: a model that costs nothing."""

    def __call__(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        return {"energy": batch.energy, "forces": batch.forces}


def argon_batch(atoms: int, systems: int, device: str, dtype: torch.dtype) -> Batch:
    """``systems`` copies of a cubic FCC argon cell of ``atoms`` atoms (4 n³), small random forces."""
    from ase.build import bulk

    n = round((atoms / 4) ** (1 / 3))
    if 4 * n**3 != atoms:
        raise SystemExit(f"{atoms} atoms is not 4 n^3 (FCC cubic cells: 108, 256, 864, 55296, ...)")
    cell = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((n, n, n))
    data = AtomicData.from_atoms(cell, dtype=dtype)
    data.atomic_masses = torch.full((atoms,), 39.948, dtype=dtype)
    batch = Batch.from_data_list([data] * systems, device=device)
    g = torch.Generator(device="cpu").manual_seed(0)
    batch.set_field("forces", (torch.randn(batch.num_nodes, 3, generator=g, dtype=dtype) * 0.01).to(device), "node")
    batch.set_field("velocities", (torch.randn(batch.num_nodes, 3, generator=g, dtype=dtype) * 1e-3).to(device), "node")
    return batch


def integrators() -> dict[str, Callable[[str], Any]]:
    from alchemi_integrators import FIRE, FIRE2, Langevin, NoseHooverChain, VelocityVerlet

    model = NoForces()
    return {
        "velocity-verlet": lambda b: VelocityVerlet(model, dt=5.0, backend=b),
        "langevin": lambda b: Langevin(model, dt=5.0, temperature=50.0, friction=0.01, backend=b),
        "langevin fix_com=False": lambda b: Langevin(model, dt=5.0, temperature=50.0, fix_com=False, backend=b),
        "nose-hoover": lambda b: NoseHooverChain(model, dt=5.0, temperature=50.0, tau=500.0, backend=b),
        "fire": lambda b: FIRE(model, dt=5.0, dt_max=50.0, backend=b),
        "fire2": lambda b: FIRE2(model, dt=5.0, dt_max=50.0, backend=b),
    }


def time_steps(make: Callable[[], Any], batch: Batch, steps: int, repeats: int) -> float:
    """Median seconds per step."""
    dynamics = make()
    dynamics.run(batch, n_steps=max(3, steps // 10))  # compile, record launches, warm caches
    sync = torch.cuda.synchronize if batch.device.type == "cuda" else (lambda: None)
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        dynamics.run(batch, n_steps=steps)
        sync()
        samples.append((time.perf_counter() - start) / steps)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), help="ATOMSxSYSTEMS, e.g. 108x2048")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", nargs="+", default=None, help="integrator names to run")
    parser.add_argument("--json", default=None, help="write the results here as JSON")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.device == "cpu":
        print(f"torch threads: {torch.get_num_threads()}")
    rows = []
    print(f"{'shape':>10} {'integrator':>24} {'torch us':>10} {'warp us':>10} {'atom-steps/s':>13} {'warp/torch':>10}")
    for shape in args.shapes:
        atoms, systems = (int(x) for x in shape.split("x"))
        for name, make in integrators().items():
            if args.only and name not in args.only:
                continue
            result: dict[str, Any] = {"shape": shape, "integrator": name, "device": args.device, "dtype": args.dtype}
            for backend in ("torch", "warp"):
                batch = argon_batch(atoms, systems, args.device, dtype)
                if args.device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                seconds = time_steps(lambda b=backend, make=make: make(b), batch, args.steps, args.repeats)
                result[f"{backend}_us_per_step"] = seconds * 1e6
                if args.device == "cuda":
                    peak = torch.cuda.max_memory_allocated() - base
                    result[f"{backend}_extra_bytes_per_atom"] = peak / batch.num_nodes
            best = min(result["torch_us_per_step"], result["warp_us_per_step"])
            result["atom_steps_per_s"] = atoms * systems / (best * 1e-6)
            result["warp_over_torch"] = result["warp_us_per_step"] / result["torch_us_per_step"]
            rows.append(result)
            print(
                f"{shape:>10} {name:>24} {result['torch_us_per_step']:10.1f} {result['warp_us_per_step']:10.1f} "
                f"{result['atom_steps_per_s']:13.3e} {result['warp_over_torch']:10.2f}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
