"""Whether an NPT integrator and its torch test oracle sample the same ensemble: many seeds of each, pooled.

``tests/integration/test_npt_statistics.py`` checks one seed. A change to how the kernels draw
their random numbers (C-rescale's Warp step draws one chi-squared per system where its torch oracle,
``plugins/alchemi-integrators/tests/integrators_testkit/oracles.py``, draws three normals per atom)
needs more: this runs ``--seeds`` seeds of ``--systems`` float64 argon cells of 256 atoms for each
of ``--backends`` (``warp``: the integrator; ``torch``: its oracle; 50 K, 0 GPa, dt 5 fs, the
statistics test's settings) and reports, for each, each quantity's mean over every system of every seed with its standard error, each
seed's mean pressure in standard errors of that seed (Student's t with ``systems - 1`` degrees of
freedom when the sampler is right), and how much more the seeds' means spread than their own
errors say (1 when systems are independent). One JSON line per run goes to ``--jsonl``.

    python -m tools.npt_seeds --kind crescale --backends torch,warp --seeds 1-20 --jsonl seeds.jsonl
    python -m tools.npt_seeds --summarise seeds.jsonl

Example:
    >>> parse_seeds("1-3,7")
    [1, 2, 3, 7]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import torch

#: The statistics test's argon (eV, Å) and thermostat/barostat settings.
EPS, SIG, RC, T = 0.0104, 3.405, 8.5125, 50.0
ATOMS = 256
QUANTITIES = {"pressure": "eV/Å³", "volume": "Å³", "temperature": "K", "volume_variance": "Å⁶"}


def parse_seeds(text: str) -> list[int]:
    """``"1-3,7"`` -> ``[1, 2, 3, 7]``."""
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        seeds.extend(range(int(lo), int(hi or lo) + 1))
    return seeds


def sample(kind: str, backend: str, seed: int, systems: int, equilibrate: int, produce: int) -> dict[str, Any]:
    """One run: per system, the time averages of pressure, volume and temperature, and the
    volume's variance, sampled every 10 steps after ``equilibrate``."""
    from ase.build import bulk

    from alchemi_core import registry
    from alchemi_core.data import Batch
    from alchemi_integrators.thermo import temperature

    cells = []
    for s in range(systems):
        atoms = bulk("Ar", "fcc", a=5.30, cubic=True).repeat(4)
        atoms.rattle(0.02, seed=s + 1000 * seed)
        cells.append(atoms)
    batch = Batch.from_atoms(cells, dtype=torch.float64)
    model = registry.build("model:lennard-jones", epsilon=EPS, sigma=SIG, cutoff=RC, shift_energy=True)
    options = {"compressibility": 60.0} if kind == "crescale" else {}
    cls = registry.resolve(f"integrator:npt-{kind}")
    if backend == "torch":
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "alchemi-integrators" / "tests"))
        from integrators_testkit.oracles import oracle

        cls = oracle(cls)
    npt = cls(model, dt=5.0, temperature=T, pressure=0.0, tau_t=100.0, tau_p=500.0, initial_temperature=T,
              random_seed=seed, **options)
    start = time.perf_counter()
    npt.run(batch, n_steps=equilibrate)
    rows: dict[str, list[torch.Tensor]] = {"pressure": [], "volume": [], "temperature": []}
    for _ in range(produce // 10):
        npt.run(batch, n_steps=10)
        rows["volume"].append(npt.volume(batch).clone())
        rows["pressure"].append(npt.pressure_tensor(batch).diagonal(dim1=-2, dim2=-1).mean(-1).clone())
        rows["temperature"].append(temperature(batch).clone())
    series = {k: torch.stack(v) for k, v in rows.items()}  # [samples, systems]
    out: dict[str, Any] = {"kind": kind, "backend": backend, "seed": seed,
                           "seconds": round(time.perf_counter() - start, 2)}
    out.update({k: v.mean(0).tolist() for k, v in series.items()})
    out["volume_variance"] = series["volume"].var(0).tolist()
    return out


def summarise(runs: list[dict[str, Any]]) -> str:
    """The table described in the module docstring."""
    lines = []
    for backend in sorted({r["backend"] for r in runs}):
        mine = [r for r in runs if r["backend"] == backend]
        lines.append(f"{mine[0]['kind']} on {backend}: {len(mine)} seeds of {len(mine[0]['pressure'])} systems")
        for name, unit in QUANTITIES.items():
            per = torch.tensor([r[name] for r in mine], dtype=torch.float64)  # [seeds, systems]
            errors = per.std(1) / math.sqrt(per.shape[1])
            spread = float(per.mean(1).var() / (errors**2).mean()) if per.shape[0] > 1 else float("nan")
            flat = per.flatten()
            lines.append(f"  {name:16s} {float(flat.mean()):.6g} ± {float(flat.std() / math.sqrt(flat.numel())):.3g} "
                         f"{unit}   seeds' spread / their errors: {spread:.2f}")
            if name == "pressure":
                t = per.mean(1) / errors
                lines.append("  pressure per seed, in its errors: " + " ".join(f"{float(x):+.1f}" for x in t)
                             + f"   (beyond 2: {int((t.abs() > 2).sum())}, beyond 3: {int((t.abs() > 3).sum())})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.npt_seeds", description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("crescale", "mtk"), default="crescale")
    parser.add_argument("--backends", default="torch,warp")
    parser.add_argument("--seeds", default="1-20", type=parse_seeds)
    parser.add_argument("--systems", type=int, default=12)
    parser.add_argument("--equilibrate", type=int, default=600)
    parser.add_argument("--produce", type=int, default=3000)
    parser.add_argument("--jsonl", default=None, help="append one line per run here")
    parser.add_argument("--summarise", default=None, metavar="JSONL", help="only summarise these runs")
    args = parser.parse_args(argv)
    if args.summarise:
        with open(args.summarise) as fh:
            print(summarise([json.loads(line) for line in fh if line.strip()]))
        return 0
    runs = []
    for seed in args.seeds:
        for backend in args.backends.split(","):
            run = sample(args.kind, backend, seed, args.systems, args.equilibrate, args.produce)
            runs.append(run)
            if args.jsonl:
                with open(args.jsonl, "a") as fh:
                    fh.write(json.dumps(run) + "\n")
    print(summarise(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
