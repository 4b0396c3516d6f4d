"""W10: nudged elastic bands, alchemi beside nvalchemi-toolkit 0.3.0 and ASE (BENCHMARKS.md W10).

64 bands of 7 images: vacancy hops in fcc argon supercells of four sizes (2x2x2 to 3x3x3, 31 to
107 atoms), 16 bands of each: the atom that hops is one of the 12 nearest neighbours of the
vacancy (in turn) and both end points of band i are rattled by the same 0.02 Å noise (seed i), so
no two bands are alike. Paths start from IDPP (``alchemi_integrators.neb_paths.interpolate``,
equal to ASE's), end points fixed, LJ argon of ``benchmarks.spec``, climbing image from the start,
spring 0.1 eV/Å², converged at a largest NEB force of 0.05 eV/Å.

* **alchemi**: ``neb()`` of all 64 bands in one batch (448 images), and inflight with slots for 16
  bands (``max_images=112``); FIRE with dt 10 fs, dt_max 100 fs; float32 on the GPU.
* **nvalchemi 0.3.0**: ``nvalchemi.dynamics.mep.NEB`` (FIRE2, climbing ``mode="immediate"``) on one
  batch of the same 448 images (``group_layout`` from ``interpolate_paths``, positions replaced by
  the same IDPP images), its ``LennardJonesModelWrapper``.
* **ASE** (CPU): ``NEB(method="improvedtangent", climb=True)`` + ``FIRE`` band by band, timed over
  the first ``--ase-bands`` bands and scaled to 64.

Reported: wall time until every band converged (after a warm-up on two bands), bands out and
converged, and the largest difference of barriers against ASE's (1 meV is the target).

Run (GPU)::

    python -m benchmarks.w10_neb --json w10.json

``--quick`` runs four small bands (a smoke test on a CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
import torch

from benchmarks import spec

FMAX, K, N_IMAGES, RATTLE = 0.05, 0.1, 7, 0.02
SIZES = ((2, 2, 2), (3, 2, 2), (3, 3, 2), (3, 3, 3))
MAX_STEPS = 2000


def bands(count: int, sizes: tuple[tuple[int, int, int], ...] = SIZES) -> list[list[Any]]:
    """W10's bands (IDPP paths of ``N_IMAGES`` images), ``count`` of them."""
    from ase.build import bulk

    from alchemi_integrators.neb_paths import interpolate

    out = []
    per_size = max(1, count // len(sizes))
    for i in range(count):
        crystal = bulk("Ar", "fcc", a=spec.LATTICE, cubic=True).repeat(sizes[min(i // per_size, len(sizes) - 1)])
        vacancy = crystal.positions[0].copy()
        distances = np.linalg.norm(crystal.positions - vacancy, axis=1)
        neighbours = np.argsort(distances)[1:13]  # the 12 nearest neighbours (indices before deletion)
        hop = int(neighbours[i % 12]) - 1
        noise = np.random.default_rng(i).normal(scale=RATTLE, size=(len(crystal) - 1, 3))
        del crystal[0]
        initial = crystal.copy()
        initial.positions += noise
        final = initial.copy()
        final.positions[hop] = vacancy + noise[hop]
        out.append(interpolate(initial, final, N_IMAGES, method="idpp", mic=True))
    return out


def _ase_barrier(images: list[Any]) -> float:
    energies = [im.get_potential_energy() for im in images]
    return float(max(energies) - energies[0])


# ---------------------------------------------------------------------------------- alchemi
def alchemi_run(paths: list[list[Any]], device: str, max_images: int | None) -> dict[str, Any]:
    from alchemi_integrators.neb import neb
    from alchemi_potentials import LennardJones

    model = LennardJones(spec.EPSILON, spec.SIGMA, spec.CUTOFF, skin=spec.SKIN, shift_energy=True)  # ASE's energies
    kwargs: dict[str, Any] = {"k": K, "climb": True, "fmax": FMAX, "n_steps": MAX_STEPS, "dt": 10.0, "dt_max": 100.0,
                              "dtype": torch.float32, "device": device}
    neb(paths[:2], model, **kwargs)  # warm-up: Warp modules, neighbour lists
    _sync(device)
    start = time.perf_counter()
    results = neb(paths, model, max_images=max_images, **kwargs)
    _sync(device)
    return {"seconds": time.perf_counter() - start, "bands_out": len(results),
            "converged": sum(r.converged for r in results), "barriers": [r.barrier for r in results]}


# ---------------------------------------------------------------------------------- nvalchemi
def nvalchemi_run(paths: list[list[Any]], device: str) -> dict[str, Any]:
    from nvalchemi.data import Batch
    from nvalchemi.dynamics.mep import NEB, ClimbingImageConfig, interpolate_paths
    from nvalchemi.models.lj import LennardJonesModelWrapper

    from benchmarks.adapters.nvalchemi import _data

    def ends(which: int) -> Any:
        return Batch.from_data_list(
            [_data(torch.as_tensor(p[which].positions), torch.as_tensor(np.asarray(p[which].cell)), None, device)
             for p in paths], device=device)

    def run(selected: list[list[Any]]) -> Any:
        batch = interpolate_paths(ends(0)[: len(selected)], ends(-1)[: len(selected)], N_IMAGES)
        images = np.concatenate([im.positions for p in selected for im in p])
        batch.positions = torch.as_tensor(images, dtype=torch.float32, device=device)
        batch.energy = torch.zeros(batch.num_graphs, 1, device=device)
        batch.forces = torch.zeros_like(batch.positions)
        batch.velocities = torch.zeros_like(batch.positions)
        model = LennardJonesModelWrapper(epsilon=spec.EPSILON, sigma=spec.SIGMA, cutoff=spec.CUTOFF)
        strategy = NEB(model=model, spring=K, climbing=ClimbingImageConfig(mode="immediate"), fmax=FMAX,
                       n_steps=MAX_STEPS)
        return strategy.run(batch)

    run(paths[:2])
    _sync(device)
    start = time.perf_counter()
    out = run(paths)
    _sync(device)
    seconds = time.perf_counter() - start
    energy = out.energy.view(-1).double().cpu().numpy().reshape(len(paths), N_IMAGES)
    return {"seconds": seconds, "bands_out": len(paths), "barriers": (energy.max(1) - energy[:, 0]).tolist(),
            "converged": int((out.status.view(-1).cpu() > 0).view(len(paths), N_IMAGES).all(1).sum())}


# ---------------------------------------------------------------------------------- ASE
def ase_run(paths: list[list[Any]], count: int) -> dict[str, Any]:
    from ase.calculators.lj import LennardJones as AseLJ
    from ase.mep import NEB
    from ase.optimize import FIRE

    barriers, converged = [], 0
    start = time.perf_counter()
    for band in paths[:count]:
        images = [im.copy() for im in band]
        for im in images:
            im.calc = AseLJ(epsilon=spec.EPSILON, sigma=spec.SIGMA, rc=spec.CUTOFF, smooth=False)
        converged += bool(FIRE(NEB(images, k=K, climb=True, method="improvedtangent"), logfile=None).run(
            fmax=FMAX, steps=MAX_STEPS))
        barriers.append(_ase_barrier(images))
    seconds = time.perf_counter() - start
    return {"seconds": seconds * len(paths) / count, "measured_bands": count, "converged": converged,
            "barriers": barriers}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _attempt(fn: Any, *args: Any) -> dict[str, Any]:
    try:
        return fn(*args)
    except ImportError as exc:
        return {"unavailable": f"{type(exc).__name__}: {exc}"}
    except Exception as exc:  # noqa: BLE001 - a peer's failure is a row, not the end of the run
        return {"error": f"{type(exc).__name__}: {exc}"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.w10_neb", description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--frameworks", default="alchemi,nvalchemi,ase")
    p.add_argument("--ase-bands", type=int, default=4)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    frameworks = args.frameworks.split(",")
    paths = bands(4, SIZES[:2]) if args.quick else bands(64)
    out: dict[str, Any] = {"bands": len(paths), "images": N_IMAGES, "fmax": FMAX, "device": args.device}
    if "alchemi" in frameworks:
        out["alchemi"] = _attempt(alchemi_run, paths, args.device, None)
        out["alchemi-inflight"] = _attempt(alchemi_run, paths, args.device, 16 * N_IMAGES)
    if "nvalchemi" in frameworks:
        out["nvalchemi"] = _attempt(nvalchemi_run, paths, args.device)
    if "ase" in frameworks:
        out["ase"] = _attempt(ase_run, paths, min(args.ase_bands, len(paths)))
    reference = out.get("ase", {}).get("barriers")
    for name in ("alchemi", "alchemi-inflight", "nvalchemi"):
        row = out.get(name, {})
        if reference and "barriers" in row:
            row["barrier_vs_ase_eV"] = float(np.abs(np.subtract(row["barriers"][: len(reference)], reference)).max())
    if "seconds" in out.get("alchemi", {}) and "seconds" in out.get("nvalchemi", {}):
        out["alchemi_vs_nvalchemi"] = out["nvalchemi"]["seconds"] / out["alchemi"]["seconds"]
    for name, row in out.items():
        if isinstance(row, dict):
            shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if k != "barriers"}
            print(f"{name:18s} {shown}")
        else:
            print(f"{name:18s} {row}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
