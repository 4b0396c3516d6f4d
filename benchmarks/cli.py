"""``python -m benchmarks``: run the workloads, print a table per case, write the JSON.

    python -m benchmarks --json out.json                          # GPU: W1, W2, W3, W5, then W1 scaling shapes
    python -m benchmarks --device cpu --json w6.json              # CPU: W6
    python -m benchmarks --workloads W1:108x1,W2 --budget-s 120
    python -m benchmarks --quick --device cpu                     # tiny sizes, seconds
    python -m benchmarks --w4-json w4.json --w4-json w3.json      # report W4 (two-rank pipeline)
    python -m benchmarks --workloads W1:256x1024 --tuning "skin=0.5,join_fraction=1.0"

The JSON is rewritten after every case, so a run stopped by its time limit keeps what it did.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from alchemi_core.errors import AlchemiError
from benchmarks import choices, spec, w1_nvt, w2_relax, w3_inflight, w4_report, w5_snapshots
from benchmarks.adapters import FRAMEWORKS, load
from benchmarks.harness import Context
from benchmarks.report import render, write_json
from benchmarks.structures import repeat_for
from benchmarks.timing import Budget
from benchmarks.tunings import Tunings

#: Most important first (BENCHMARKS.md targets): what runs when --workloads is not given.
GPU_ORDER = ("W1:256x1024", "W1:108x1", "W2", "W1:108x2048", "W1:55296x1", "W3", "W5",
             *(f"W1:{a}x{s}" for a, s in spec.W1_SCALING))
CPU_ORDER = ("W6:108x64", "W6:864x1")
QUICK_ORDER = ("W1:108x2", "W2", "W3", "W5", "W6:108x4")
#: Seconds each framework may spend on one case.
CAPS = {"W1": 90.0, "W2": 60.0, "W3": 150.0, "W5": 90.0, "W6": 90.0}
QUICK_CAP = 60.0


def _shapes(workload: str) -> tuple[tuple[int, int], ...]:
    return spec.W1_SHAPES if workload == "W1" else spec.W6_SHAPES


def expand(tokens: list[str]) -> list[str]:
    """``W1`` -> every W1 shape; ``W1:108x1`` stays; unknown names are an error.

    Raises:
        SystemExit: A token names no workload or a malformed shape.
    """
    out = []
    for token in tokens:
        name, _, shape = token.strip().upper().partition(":")
        if name in ("W1", "W6"):
            if shape:
                try:
                    atoms, systems = (int(x) for x in shape.lower().split("x"))
                except ValueError:
                    raise SystemExit(f"--workloads: {token!r}: a shape is ATOMSxSYSTEMS, e.g. W1:108x1") from None
                try:  # checked before anything runs, not when the shape's turn comes
                    repeat_for(atoms)
                except ValueError as e:
                    raise SystemExit(f"--workloads: {token!r}: {e}") from None
                out.append(f"{name}:{atoms}x{systems}")
            else:
                out.extend(f"{name}:{a}x{s}" for a, s in _shapes(name))
        elif name in ("W2", "W3", "W5") and not shape:
            out.append(name)
        elif name == "W4":
            raise SystemExit(
                "--workloads: W4 runs under torchrun (plugins/alchemi-nccl/benchmarks/w4_pipeline.py); "
                "pass its JSON with --w4-json"
            )
        else:
            raise SystemExit(f"--workloads: unknown {token!r}; use W1, W1:ATOMSxSYSTEMS, W2, W3, W5, W6")
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("--json", default=None, help="write every figure here (rewritten after each case)")
    p.add_argument("--workloads", default=None, help="comma-separated: W1, W1:108x1, W2, W3, W5, W6, W6:864x1")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    p.add_argument("--quick", action="store_true", help="tiny sizes and short runs (a check that everything works)")
    p.add_argument("--budget-s", type=float, default=540.0, help="stop starting new work after this many seconds")
    p.add_argument("--w3-cells", type=int, default=None, help=f"W3 structures (default {spec.W3_CELLS:,})")
    p.add_argument("--w4-json", action="append", default=[], help="w4_pipeline.py results (pipeline and/or --fused)")
    p.add_argument(
        "--frameworks", default=",".join(FRAMEWORKS), help="comma-separated subset of " + ", ".join(FRAMEWORKS)
    )
    p.add_argument(
        "--tuning", default="",
        help="alchemi's per-device choices for the whole run, name=value,... of the fields of CoreTuning, "
        "PotentialsTuning and ZarrTuning (benchmarks.tunings; recorded in the JSON)",
    )
    p.add_argument(
        "--variant", default="",
        help="values of benchmarks.spec that the adapters read for the whole run, module:NAME=value,... "
        "(benchmarks.choices; recorded in the JSON)",
    )
    args = p.parse_args(argv)
    try:
        args.choices = choices.parse_variant(args.variant)
    except (ValueError, ImportError, AttributeError) as e:
        p.error(f"--variant: {e}")
    try:
        if args.tuning:  # checked only when given: an older checkout (compare_commits) has no Tuning
            Tunings.parse(args.device, args.tuning)
    except (ValueError, AlchemiError) as e:
        p.error(f"--tuning: {e}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device; use --device cpu")
    unknown = set(args.frameworks.split(",")) - set(FRAMEWORKS)
    if unknown:
        p.error(f"--frameworks: unknown {sorted(unknown)}; choose from {', '.join(FRAMEWORKS)}")
    return args


def run_one(ctx: Context, item: str, args: argparse.Namespace) -> dict[str, Any]:
    name, _, shape = item.partition(":")
    cap = QUICK_CAP if ctx.quick else CAPS[name]
    if name in ("W1", "W6"):
        atoms, systems = (int(x) for x in shape.split("x"))
        if name == "W6" and ctx.device != "cpu":
            ctx = Context("cpu", ctx.quick, ctx.budget, ctx.frameworks, ctx.scratch, ctx.log)
        return w1_nvt.run_case(ctx, name, atoms, systems, cap)
    if name == "W2":
        return w2_relax.run_case(ctx, cap)
    if name == "W3":
        return w3_inflight.run_case(ctx, cap, args.w3_cells)
    return w5_snapshots.run_case(ctx, cap)


def meta(args: argparse.Namespace, frameworks: dict[str, Any]) -> dict[str, Any]:
    return {
        "command": " ".join(["python -m benchmarks", *sys.argv[1:]]),
        # Other processes on the machine skew CPU figures (W6); this says how busy it was.
        "load_average_at_start": os.getloadavg()[0],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "frameworks": {
            n: ({"version": f.version, "how": f.notes} if not isinstance(f, str) else {"unavailable": f})
            for n, f in frameworks.items()
        },
        "args": {k: v for k, v in vars(args).items() if k != "choices"},  # (choices: parsed --variant)
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    items = (
        expand(args.workloads.split(","))
        if args.workloads
        else list(QUICK_ORDER if args.quick else GPU_ORDER if args.device == "cuda" else CPU_ORDER)
    )
    frameworks = {name: load(name) for name in args.frameworks.split(",")}
    if args.tuning and not isinstance(frameworks.get("alchemi", ""), str):
        frameworks["alchemi"].tuning = args.tuning  # type: ignore[union-attr]  # the Alchemi adapter
    for name, fw in frameworks.items():
        print(f"{name:<10} {fw if isinstance(fw, str) else fw.version}", file=sys.stderr)
    info = meta(args, frameworks)
    cases: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="alchemi-bench-") as scratch, choices.chosen(args.choices):
        ctx = Context(
            args.device,
            args.quick,
            Budget(args.budget_s),
            frameworks,
            Path(scratch),
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
        for item in items:
            print(f"{item} ...", file=sys.stderr, flush=True)
            cases.append(run_one(ctx, item, args))
            print("\n" + render(cases[-1]), flush=True)
            if args.json:
                write_json(args.json, info, cases)
    if args.w4_json:
        cases.append(w4_report.run_case(args.w4_json))
        print("\n" + render(cases[-1]), flush=True)
    if args.json:
        write_json(args.json, info, cases)
    return 0
