"""Compare two checkouts of alchemi on the same host, back to back: the harness's workloads (W1
256x1024 and 108x1, W2, W3), W8 and W7.

Each checkout's core and plugins are installed (not editable) into a folder of their own, which
goes first on ``PYTHONPATH`` for that checkout's runs (the installed torch and whatever else is on
``PYTHONPATH`` serve both; an editable install of either checkout elsewhere is shadowed, and
Python keeps the first distribution of a name it finds, so its entry points are the folder's),
and the same harness (this checkout's ``benchmarks/``, copied aside so neither checkout's
sources shadow the other's) runs ``--frameworks alchemi`` with each. Rounds alternate base, new, base, new, ...
so drift of the host affects both alike; the table gives each figure's median over rounds and
the ratio new/base (below 1.0: the new checkout is faster).

Usage (from the root of the new checkout)::

    python benchmarks/compare_commits.py export-base a3fe2c7      # writes .bench-base/ (git archive)
    python benchmarks/compare_commits.py run --base .bench-base --new . --rounds 2 --json cmp.json
    python benchmarks/compare_commits.py run --base .bench-base --workloads W3 --rounds 4   # one case
    python benchmarks/compare_commits.py run --base .bench-base --suites w8,w7-mace \
        --mlip-path mace=/path/to/mace-site --rounds 2                                     # W8, W7

``--suites`` picks what runs: ``harness`` (``python -m benchmarks --workloads ...``), ``w8``
(``python -m benchmarks.w8_cell --frameworks alchemi``: the relaxation's seconds and each NPT
integrator's ms per step) and ``w7-mace`` / ``w7-sevennet`` (``python -m benchmarks.w7_mlip
--sizes 64``: ms per step at 64 cells; the model's package comes from ``--mlip-path``, since MACE
and SevenNet need different e3nn versions on the path).

``export-base`` needs git (run it where the repository is); ``.bench-base/`` is a plain folder,
so it can be copied to a machine without git. ``run`` needs no network:
``pip install --no-deps --no-build-isolation --target`` uses the installed setuptools.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

#: Plugins the three workloads use (LJ, FIRE, Langevin, the Warp buffer ops, hooks).
PLUGINS = ("integrators", "potentials", "hooks", "warp", "zarr", "mace", "sevennet")
WORKLOADS = "W1:256x1024,W1:108x1,W2,W3"
SUITES = "harness"
#: The figure compared per workload (lower is better for each).
METRICS = {"W1": "ms_per_step", "W2": "seconds", "W3": "seconds", "W6": "ms_per_step"}


def export_base(commit: str, dest: Path) -> None:
    """Write the tree of ``commit`` to ``dest`` (replaced)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    print(f"{commit} written to {dest}")


def install(root: Path, target: Path) -> dict[str, str]:
    """``root``'s core and plugins installed into ``target``; the environment that runs them."""
    if target.exists():
        shutil.rmtree(target)
    args = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target)]
    args.append(str(root))
    for name in PLUGINS:
        plugin = root / "plugins" / f"alchemi-{name}"
        if plugin.exists():
            args.append(str(plugin))
    subprocess.run(args, check=True)
    return _env_of(target)


def _env_of(target: Path) -> dict[str, str]:
    """The environment of an install made earlier into ``target``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_side(env: dict[str, str], harness: Path, out: Path, extra: list[str], workloads: str = WORKLOADS) -> dict[str, Any]:
    """One harness run in ``env``; the JSON it wrote."""
    cmd = [sys.executable, "-m", "benchmarks", "--frameworks", "alchemi", "--workloads", workloads, "--json", str(out)]
    print("$", " ".join(cmd + extra), flush=True)
    subprocess.run(cmd + extra, cwd=harness, check=True, env=env)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def run_module(env: dict[str, str], harness: Path, out: Path, module: str, args: list[str]) -> dict[str, Any]:
    """``python -m benchmarks.<module> ... --json out`` in ``env``; the JSON it wrote."""
    cmd = [sys.executable, "-m", f"benchmarks.{module}", *args, "--json", str(out)]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=harness, check=False, env=env, stdout=subprocess.DEVNULL)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def w8_figures(result: dict[str, Any]) -> dict[str, float]:
    """W8's relaxation seconds and each NPT integrator's ms per step."""
    out = {}
    relax = result.get("relax", {}).get("alchemi", {})
    if isinstance(relax.get("seconds"), (int, float)):
        out["W8 relax seconds"] = float(relax["seconds"])
    for kind in ("mtk", "crescale"):
        npt = result.get("npt", {}).get(f"alchemi-{kind}", {})
        if isinstance(npt.get("steps_per_s"), (int, float)) and npt["steps_per_s"] > 0:
            out[f"W8 npt-{kind} ms_per_step"] = 1e3 / float(npt["steps_per_s"])
    return out


def w7_figures(result: dict[str, Any]) -> dict[str, float]:
    """W7's ms per step for each cell count that ran."""
    return {f"W7 {result.get('model')} {case['cells']} cells ms_per_step": float(case["alchemi"]["ms_per_step"])
            for case in result.get("cases", []) if isinstance(case.get("alchemi", {}).get("ms_per_step"), float)}


def figures(result: dict[str, Any]) -> dict[str, float]:
    """``{workload id: figure}`` of alchemi's rows that ran."""
    out = {}
    for case in result.get("workloads", []):
        key = str(case.get("id", ""))
        row = case.get("results", {}).get("alchemi", {})
        metric = METRICS.get(key)
        if metric and isinstance(row.get(metric), (int, float)):
            out[f"{key} {case.get('case', '')} {metric}"] = float(row[metric])
    return out


def compare(base: dict[str, list[float]], new: dict[str, list[float]]) -> list[dict[str, Any]]:
    rows = []
    for case in sorted(set(base) & set(new)):
        b, n = statistics.median(base[case]), statistics.median(new[case])
        rows.append({"case": case, "base": b, "new": n, "ratio": n / b if b else float("nan"),
                     "base_all": base[case], "new_all": new[case]})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export-base", help="write a commit's tree to .bench-base/ (needs git)")
    e.add_argument("commit")
    e.add_argument("--dest", default=".bench-base")
    r = sub.add_parser("run", help="run both checkouts back to back and print the ratios")
    r.add_argument("--base", required=True, help="root of the old checkout")
    r.add_argument("--new", default=".", help="root of the new checkout (its harness is used)")
    r.add_argument("--rounds", type=int, default=1, help="alternating rounds (base, new) per checkout")
    r.add_argument("--work", default="/tmp/alchemi-compare", help="where the installs and results go")
    r.add_argument("--json", default=None, help="write the comparison here")
    r.add_argument("--w3-cells", type=int, default=None, help="W3 structures (default: the harness's)")
    r.add_argument("--quick", action="store_true", help="the harness's tiny sizes (a check that all works)")
    r.add_argument("--workloads", default=WORKLOADS, help=f"the harness's cases (default {WORKLOADS})")
    r.add_argument("--suites", default=SUITES, help="comma-separated: harness, w8, w7-mace, w7-sevennet")
    r.add_argument("--mlip-path", action="append", default=[],
                   help="MODEL=DIR: a folder put first on the path for W7 of that model (repeatable)")
    r.add_argument("--reuse", action="store_true", help="keep the installs of an earlier run in --work")
    args = p.parse_args(argv)
    if args.command == "export-base":
        export_base(args.commit, Path(args.dest))
        return 0
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    roots = {"base": Path(args.base).resolve(), "new": Path(args.new).resolve()}
    harness = work / "harness"
    if args.reuse and (harness / "benchmarks").exists():
        envs = {label: _env_of(work / f"site-{label}") for label in roots}
    else:
        if harness.exists():
            shutil.rmtree(harness)
        harness.mkdir()
        shutil.copytree(roots["new"] / "benchmarks", harness / "benchmarks",
                        ignore=shutil.ignore_patterns("__pycache__", "results*"))
        envs = {label: install(root, work / f"site-{label}") for label, root in roots.items()}
    mlip = dict(item.split("=", 1) for item in args.mlip_path)
    suites = args.suites.split(",")
    extra = ["--w3-cells", str(args.w3_cells)] if args.w3_cells else []
    if args.quick:
        extra.append("--quick")
    seen: dict[str, dict[str, list[float]]] = {"base": {}, "new": {}}
    for rnd in range(args.rounds):
        for label in ("base", "new"):
            found: dict[str, float] = {}
            if "harness" in suites:
                found |= figures(run_side(envs[label], harness, work / f"{label}-{rnd}.json", extra, args.workloads))
            if "w8" in suites:
                found |= w8_figures(run_module(envs[label], harness, work / f"{label}-w8-{rnd}.json", "w8_cell",
                                               ["--frameworks", "alchemi", *(["--quick"] if args.quick else [])]))
            for suite in suites:
                if suite.startswith("w7-"):
                    model = suite.removeprefix("w7-")
                    env = dict(envs[label])
                    if model in mlip:
                        env["PYTHONPATH"] = os.pathsep.join([mlip[model], env["PYTHONPATH"]])
                    found |= w7_figures(run_module(env, harness, work / f"{label}-{suite}-{rnd}.json", "w7_mlip",
                                                   ["--model", model, "--sizes", "1" if args.quick else "64",
                                                    *(["--quick"] if args.quick else [])]))
            print(f"[{label}, round {rnd + 1}] {json.dumps(found)}", flush=True)  # kept if the run is cut short
            for case, value in found.items():
                seen[label].setdefault(case, []).append(value)
    rows = compare(seen["base"], seen["new"])
    print(f"\n{'case':<44} {'base':>10} {'new':>10} {'new/base':>9}")
    for row in rows:
        print(f"{row['case']:<44} {row['base']:>10.4g} {row['new']:>10.4g} {row['ratio']:>9.3f}")
    worst = max((row["ratio"] for row in rows), default=float("nan"))
    print(f"worst new/base: {worst:.3f} ({'within' if worst <= 1.05 else 'beyond'} 5 %)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "roots": {k: str(v) for k, v in roots.items()}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
