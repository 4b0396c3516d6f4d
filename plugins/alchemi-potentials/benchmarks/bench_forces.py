"""Time the Lennard-Jones forward of BENCHMARKS.md workload W1 (LJ argon, FCC a = 5.26 Å,
sigma 3.405 Å, epsilon 0.0104 eV, cutoff 8.5125 Å, float32, periodic).

For every shape (atoms per system x systems) it reports the median time of one forward (energy
and forces, neighbour list included) in three modes:

* ``steady``: atoms barely move (no system rebuilds its list): the usual MD step,
* ``rebuild``: every atom moves by more than skin/2 before each forward, so every system
  rebuilds (the worst step; the move itself is one small torch op, included),
* ``graph`` (CUDA only): the steady forward captured in a CUDA graph and replayed, which is how a
  compiled step runs it (no Python or launch overhead),

as atom-steps/s (atoms x systems / time) and the bytes of device memory the model adds per atom
(the peak over the runs minus the batch itself; CUDA), or the bytes its buffers hold (CPU).

``--unroll 4,2`` and ``--order columns,rows`` time variants of the pair kernel (neighbours read
per iteration; neighbour matrix memory order) side by side; ``--profile`` prints the GPU time of
every kernel of a steady and of a rebuilding forward (torch.profiler), for each shape's first
variant.

Run:
    python plugins/alchemi-potentials/benchmarks/bench_forces.py                  # GPU if present
    python plugins/alchemi-potentials/benchmarks/bench_forces.py --device cpu --shapes 108x1,108x64,256x16
    python plugins/alchemi-potentials/benchmarks/bench_forces.py --unroll 4,2,1 --order columns,rows --profile
    python plugins/alchemi-potentials/benchmarks/bench_forces.py --json results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch

SIGMA, EPSILON, CUTOFF, LATTICE = 3.405, 0.0104, 8.5125, 5.26
DEFAULT_SHAPES = "108x1,108x2048,256x1024,55296x1"


def w1_batch(atoms_per_system: int, systems: int, device: str, dtype: torch.dtype, seed: int = 0):
    """``systems`` copies of the W1 crystal, each rattled by its own 0.02 Å noise."""
    from ase.build import bulk

    from alchemi_core.data import AtomicData, Batch

    n = round((atoms_per_system / 4) ** (1 / 3))
    if 4 * n**3 != atoms_per_system:
        raise SystemExit(f"W1 systems hold 4 n^3 atoms (108, 256, 864, 55296, ...), not {atoms_per_system}")
    crystal = AtomicData.from_atoms(bulk("Ar", "fcc", a=LATTICE, cubic=True).repeat((n, n, n)), dtype=dtype)
    batch = Batch.from_data_list([crystal] * systems, device=device)
    g = torch.Generator(device="cpu").manual_seed(seed)
    batch.positions.add_((0.02 * torch.randn(batch.positions.shape, generator=g)).to(device, dtype))
    batch.set_field("forces", torch.zeros_like(batch.positions), "node")
    batch.set_field("energy", torch.zeros(systems, 1, dtype=dtype, device=device), "system")
    return batch


def timed(fn: Callable[[], None], device: str, steps: int, repeats: int) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` loops of ``steps`` calls."""
    samples = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / steps)
        else:
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            samples.append((time.perf_counter() - t0) / steps)
    return statistics.median(samples)


def profile_forward(forward: Callable[[], None], label: str, out) -> None:
    """Print the GPU time of every kernel of one call of ``forward`` (averaged over 20 calls)."""
    from torch.profiler import ProfilerActivity, profile

    calls = 20
    forward()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            forward()
        torch.cuda.synchronize()
    # Kernel rows only (the torch operations that launched them carry the same time again).
    rows = [(e.key, e.device_time_total / calls, e.count / calls) for e in prof.key_averages()
            if str(e.device_type).endswith("CUDA") and e.device_time_total > 0]
    print(f"  {label}: GPU time per forward by kernel", file=out)
    for key, us, count in sorted(rows, key=lambda r: -r[1]):
        print(f"    {us:9.1f} us  x{count:4.1f}  {key[:100]}", file=out)
    print(f"    {sum(r[1] for r in rows):9.1f} us  total", file=out)


def bench_shape(atoms: int, systems: int, device: str, dtype: torch.dtype, steps: int, repeats: int,
                skin: float, profile_out=None, tuning=None) -> dict:
    from alchemi_potentials import LennardJones

    batch = w1_batch(atoms, systems, device, dtype)
    total = atoms * systems
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    model = LennardJones(EPSILON, SIGMA, CUTOFF, skin=skin, tuning=tuning)
    model(batch)  # sizes the neighbour list (one read-back), compiles or loads the kernels
    columns = model.neighbor_list.max_neighbors
    result: dict = {"atoms": atoms, "systems": systems, "total_atoms": total, "device": device,
                    "dtype": str(dtype).replace("torch.", ""), "skin": skin, "max_neighbors": columns}

    result["steady_s"] = timed(lambda: model(batch), device, steps, repeats)
    jump = torch.full_like(batch.positions, 0.6 * skin)
    sign = [1.0]

    def moved_forward() -> None:
        batch.positions.add_(jump, alpha=sign[0])
        sign[0] = -sign[0]
        model(batch)

    builds0 = model.neighbor_list.builds(batch).min().item()
    result["rebuild_s"] = timed(moved_forward, device, steps, repeats)
    rebuilt = model.neighbor_list.builds(batch).min().item() - builds0
    result["rebuilds_checked"] = bool(rebuilt >= steps * repeats)
    if profile_out is not None and device == "cuda":
        print(f"{atoms}x{systems}:", file=profile_out)
        profile_forward(lambda: model(batch), "steady", profile_out)
        profile_forward(moved_forward, "rebuild", profile_out)
    if device == "cuda":
        fixed = LennardJones(EPSILON, SIGMA, CUTOFF, skin=skin, max_neighbors=columns, tuning=tuning)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fixed(batch)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fixed(batch)
        result["graph_s"] = timed(graph.replay, device, steps, repeats)
        torch.cuda.synchronize()
        result["bytes_per_atom"] = (torch.cuda.max_memory_allocated() - base) / total
    else:
        result["bytes_per_atom"] = model.memory_bytes() / total
    for mode in ("steady", "rebuild", "graph"):
        if f"{mode}_s" in result:
            result[f"{mode}_atom_steps_per_s"] = total / result[f"{mode}_s"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="atoms x systems, comma separated")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--steps", type=int, default=None, help="calls per timed loop (default 50 GPU, 5 CPU)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skin", type=float, default=0.5)
    parser.add_argument("--unroll", default=None, help="neighbours per pair-kernel iteration, comma separated (1,2,4)")
    parser.add_argument("--order", default=None, help="neighbour matrix memory order(s): columns,rows")
    parser.add_argument("--profile", action="store_true", help="GPU time of every kernel (each shape's first variant)")
    parser.add_argument("--json", nargs="?", const="-", default=None, help="write JSON to a file ('-': stdout)")
    args = parser.parse_args(argv)
    import attrs

    from alchemi_potentials.tuning import PotentialsTuning

    default = PotentialsTuning.for_device(args.device)
    unrolls = [int(u) for u in args.unroll.split(",")] if args.unroll else [default.unroll]
    orders = args.order.split(",") if args.order else [default.matrix_order]
    variants = [(u, o) for o in orders for u in unrolls]
    steps = args.steps or (50 if args.device == "cuda" else 5)
    dtype = getattr(torch, args.dtype)
    out = sys.stderr if args.json == "-" else sys.stdout
    print(f"W1 forward on {args.device} ({args.dtype}): median per forward; B/atom = model memory per atom", file=out)
    print("shape         variant      steady_us  atom-st/s  rebuild_us  atom-st/s   graph_us  atom-st/s  B/atom  cols",
          file=out)
    rows = []
    for shape in args.shapes.split(","):
        atoms, systems = (int(v) for v in shape.lower().split("x"))
        for k, (unroll, order) in enumerate(variants):
            tuning = attrs.evolve(default, unroll=unroll, matrix_order=order)
            profile_out = out if args.profile and k == 0 else None
            rows.append(bench_shape(atoms, systems, args.device, dtype, steps, args.repeats, args.skin, profile_out,
                                    tuning))
            r = rows[-1]
            r.update(unroll=unroll, order=order)
            graph = f"{r['graph_s'] * 1e6:10.1f} {r['graph_atom_steps_per_s']:10.3g}" if "graph_s" in r else " " * 21
            print(f"{atoms:>6}x{systems:<5} {order:>7}/u{unroll} {r['steady_s'] * 1e6:10.1f} "
                  f"{r['steady_atom_steps_per_s']:10.3g} {r['rebuild_s'] * 1e6:10.1f} {r['rebuild_atom_steps_per_s']:10.3g} "
                  f"{graph} {r['bytes_per_atom']:8.0f}  {r['max_neighbors']}", file=out)
    if args.json:
        text = json.dumps({"workload": "W1 forces", "results": rows}, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
