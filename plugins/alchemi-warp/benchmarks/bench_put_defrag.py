"""Time Batch.put / defrag / zero with the Warp row-copy kernels against the torch ops.

A batch of ``--systems`` structures of ``--atoms`` atoms (int64 atomic numbers, float positions,
velocities, forces and masses, a bool mask, cells, energies, ids; optionally a neighbour list
with ``--edges-per-atom`` edges per atom) moves ``--moved`` of its systems into a pre-allocated
buffer (``put``), removes them (``defrag``) and the buffer is emptied (``zero``). The same
sequence runs with ``buffer:torch``, with every operation as a Warp kernel, and with
``buffer:warp``'s default split (Warp for shifted index gathers only), and the resulting tensors
are compared byte for byte. Single gathers of one field time the kernels without ``put``'s host planning.

On a GPU the times come from CUDA events (median over ``--repeats``); on the CPU from
``time.perf_counter`` (Warp's CPU kernels are serial loops, so the CPU numbers only show that
the path works).

Usage::

    python plugins/alchemi-warp/benchmarks/bench_put_defrag.py            # GPU when present
    python plugins/alchemi-warp/benchmarks/bench_put_defrag.py --edges-per-atom 40 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from alchemi_core.data import AtomicData, Batch
from alchemi_core.data.buffer_ops import BufferOps, TorchBufferOps
from alchemi_warp.buffer_ops import WarpBufferOps


def make_source(systems: int, atoms: int, edges_per_atom: int, dtype: torch.dtype, device: str) -> Batch:
    """``systems`` copies of one random structure (values do not matter for a row copy)."""
    g = torch.Generator().manual_seed(0)
    fields: dict[str, Any] = {
        "atomic_numbers": torch.randint(1, 90, (atoms,), generator=g),
        "positions": torch.randn(atoms, 3, generator=g).to(dtype),
        "velocities": torch.randn(atoms, 3, generator=g).to(dtype),
        "forces": torch.randn(atoms, 3, generator=g).to(dtype),
        "atomic_masses": torch.rand(atoms, generator=g).to(dtype),
        "frozen": torch.rand(atoms, generator=g) < 0.1,
        "cell": torch.eye(3, dtype=dtype) * 12.0,
        "pbc": torch.tensor([True, True, True]),
        "energy": torch.zeros(1, 1, dtype=dtype),
    }
    if edges_per_atom:
        n_edges = atoms * edges_per_atom
        fields["neighbor_list"] = torch.randint(0, atoms, (n_edges, 2), generator=g)
        fields["shifts"] = torch.zeros(n_edges, 3, dtype=dtype)
    batch = Batch.from_data_list([AtomicData(**fields)] * systems, device=device)
    batch.set_field("system_id", torch.arange(systems, device=device), "system")
    return batch


class Timer:
    """Milliseconds of device work: CUDA events on a GPU, wall clock on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], Any]) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3


def run_sequence(ops: BufferOps, args: argparse.Namespace, device: torch.device) -> tuple[dict[str, float], dict]:
    """Median times of put, defrag, zero and single-field gathers with ``ops``; final tensors."""
    timer = Timer(device)
    dtype = torch.float64 if args.float64 else torch.float32
    pristine = make_source(args.systems, args.atoms, args.edges_per_atom, dtype, str(device))
    rng = np.random.default_rng(1)
    mask = torch.from_numpy(rng.random(args.systems) < args.moved).to(device)
    dest = Batch.empty(
        num_systems=args.systems,
        num_nodes=pristine.num_nodes,
        num_edges=pristine.num_edges,
        template=pristine,
    )
    n_moved = int(mask.sum())
    rows = torch.from_numpy(rng.choice(pristine.num_nodes, n_moved * args.atoms)).to(device)
    pos_out = torch.empty(len(rows), 3, dtype=dtype, device=device)
    times: dict[str, list[float]] = {"put": [], "defrag": [], "zero": [], "gather positions": []}
    if args.edges_per_atom:
        times["gather_shifted neighbor_list"] = []
        erows = torch.from_numpy(rng.choice(pristine.num_edges, n_moved * args.atoms * args.edges_per_atom)).to(device)
        eshift = torch.ones(len(erows), dtype=torch.long, device=device)
        nl_out = torch.empty(len(erows), 2, dtype=torch.long, device=device)
    for i in range(args.warmup + args.repeats):
        src = pristine.clone()
        dest.zero(ops)
        sample = {
            "put": timer(lambda src=src: dest.put(src, mask, ops)),
            "defrag": timer(lambda src=src: src.defrag(ops=ops)),
            "gather positions": timer(lambda: ops.gather(pristine.positions, rows, pos_out)),
        }
        if args.edges_per_atom:
            sample["gather_shifted neighbor_list"] = timer(
                lambda: ops.gather_shifted(pristine.neighbor_list, erows, eshift, nl_out)
            )
        final = {k: dest.storage(k).clone() for k in dest.keys()} | {f"src.{k}": src.storage(k).clone() for k in src.keys()}
        sample["zero"] = timer(lambda: dest.zero(ops))
        if i >= args.warmup:
            for k, v in sample.items():
                times[k].append(v)
    return {k: statistics.median(v) for k, v in times.items()}, final


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", type=int, default=2048)
    p.add_argument("--atoms", type=int, default=108)
    p.add_argument("--moved", type=float, default=0.3, help="fraction of systems moved by put")
    p.add_argument("--edges-per-atom", type=int, default=0)
    p.add_argument("--float64", action="store_true", help="float64 instead of float32 fields")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = p.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())

    torch_times, torch_final = run_sequence(TorchBufferOps(), args, device)
    # "warp": every operation by a Warp kernel; "default": what buffer:warp does unless told
    # otherwise (Warp for shifted index gathers, torch for the rest).
    warp_times, warp_final = run_sequence(WarpBufferOps(allow_cpu=True, every_op=True), args, device)
    default_times, default_final = run_sequence(WarpBufferOps(allow_cpu=True), args, device)
    identical = all(
        torch.equal(torch_final[k].view(torch.uint8), other[k].view(torch.uint8))
        for other in (warp_final, default_final)
        for k in torch_final
    )
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "systems": args.systems,
        "atoms_per_system": args.atoms,
        "edges_per_atom": args.edges_per_atom,
        "moved_fraction": args.moved,
        "dtype": "float64" if args.float64 else "float32",
        "repeats": args.repeats,
        "bit_identical": identical,
        "ms": {
            op: {"torch": torch_times[op], "warp": warp_times[op], "default": default_times[op]} for op in torch_times
        },
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"{result['device']}: {args.systems} systems x {args.atoms} atoms, {args.moved:.0%} moved, "
        f"{args.edges_per_atom} edges/atom, {result['dtype']}; median of {args.repeats}"
    )
    print(f"{'operation':<30}{'torch ms':>10}{'warp ms':>10}{'default ms':>12}{'torch/warp':>12}")
    for op, t in result["ms"].items():
        print(f"{op:<30}{t['torch']:>10.3f}{t['warp']:>10.3f}{t['default']:>12.3f}{t['torch'] / t['warp']:>11.2f}x")
    print(f"results bit-identical: {identical}")


if __name__ == "__main__":
    main()
