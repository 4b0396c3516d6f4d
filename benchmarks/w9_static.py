"""W9: static screening, alchemi beside TorchSim (BENCHMARKS.md W9).

The W3 set (argon cells of 4 n³ atoms, n drawn from {2, 3, 4, 6} with seed 0, rattled 0.1 Å),
each evaluated once (energy, forces, stress) in float32 with one machine-learned potential:

* ``--model sevennet``: ``7net-0`` for alchemi (``model:sevennet``) and TorchSim
  (``sevenn.torchsim.SevenNetModel``);
* ``--model mace``: a MACE with random weights shaped like MACE-MP-0 small (seed 0), the same
  network for both (``MaceTorchSimModel`` for TorchSim).

alchemi runs :func:`alchemi_core.evaluate` (``integrator:static`` fed by a
``SizeAwareSampler``, batches sized by the model's bytes per atom); TorchSim runs ``ts.static``
with its ``BinningAutoBatcher`` (``autobatcher=True``, its own memory probe included in its
time, as alchemi's batch planning is in alchemi's). Each framework first evaluates 64 cells
untimed (kernels, compilation). Reported: seconds, structures/s, the count out against the count
in (each structure once, for alchemi by ``system_id``), and the largest difference of energy per
atom between the two on the same structures.

    python -m benchmarks.w9_static --model sevennet --json out/w9_sevennet.json
    python -m benchmarks.w9_static --model mace --cells 2000
    python -m benchmarks.w9_static --model mace --device cpu --quick     # does everything run?
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import spec
from benchmarks.structures import ArgonCells
from benchmarks.w7_mlip import networks, sync

WARMUP_CELLS = 64
TARGET_SPEEDUP = 3.0


def argon_atoms(cells: ArgonCells) -> list[Any]:
    """The cells as ASE ``Atoms`` (argon, periodic)."""
    from ase import Atoms

    out = []
    for i in range(len(cells)):
        pos, cell = cells.cell(i)
        out.append(Atoms(f"Ar{len(pos)}", positions=pos.numpy(), cell=cell.numpy(), pbc=True))
    return out


def alchemi_static(model: Any, atoms: list[Any], device: str) -> dict[str, Any]:
    """Seconds to evaluate ``atoms`` with :func:`alchemi_core.evaluate`; energies per atom."""
    from alchemi_core import evaluate

    sync(device)
    t = time.perf_counter()
    done = evaluate(atoms, model, compute_stress=True, dtype=torch.float32, device=device)
    sync(device)
    seconds = time.perf_counter() - t
    ids = [a.info["system_id"] for a in done]
    failed = [a.info["system_id"] for a in done if "quarantine" in a.info]
    return {
        "seconds": seconds,
        "structures_per_s": len(atoms) / seconds,
        "count": {"in": len(atoms), "out": len(ids), "each_once": sorted(ids) == list(range(len(atoms)))},
        "quarantined": len(failed),
        "_energy_per_atom": np.array([a.get_potential_energy() / len(a) for a in done]),
    }


def torchsim_static(peer: Any, atoms: list[Any], device: str) -> dict[str, Any]:
    """Seconds for ``ts.static`` with its autobatcher over ``atoms``; energies per atom."""
    import torch_sim as ts

    sync(device)
    t = time.perf_counter()
    results = ts.static(atoms, peer, autobatcher=True)
    sync(device)
    seconds = time.perf_counter() - t
    energies = np.array([float(r["potential_energy"].reshape(-1)[0]) for r in results])
    return {
        "seconds": seconds,
        "structures_per_s": len(atoms) / seconds,
        "count": {"in": len(atoms), "out": len(results), "each_once": len(results) == len(atoms)},
        "_energy_per_atom": energies / np.array([len(a) for a in atoms]),
    }


def _attempt(fn: Any, *args: Any) -> dict[str, Any]:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - a framework that fails is reported, the other still runs
        return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=("mace", "sevennet"), required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cells", type=int, default=spec.W3_CELLS, help="structures in the set (W9: the W3 set)")
    p.add_argument("--quick", action="store_true", help="24 cells, a small MACE (a smoke test)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    count = 24 if args.quick else args.cells
    model, peers = networks(args.model, args.device, quick=args.quick, cueq=None)
    model = model.to(args.device) if hasattr(model, "to") else model
    atoms = argon_atoms(ArgonCells.drawn(count))
    warm = argon_atoms(ArgonCells.drawn(min(WARMUP_CELLS, count), seed=1))
    report: dict[str, Any] = {"workload": "W9", "model": args.model, "cells": count, "device": args.device,
                              "atoms": int(sum(len(a) for a in atoms))}
    if args.device == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    _attempt(alchemi_static, model, warm, args.device)
    report["alchemi"] = _attempt(alchemi_static, model, atoms, args.device)
    peer = peers.get("torchsim", "unavailable: no TorchSim wrapper for this model")
    if isinstance(peer, str):
        report["torchsim"] = {"status": peer}
    else:
        _attempt(torchsim_static, peer, warm, args.device)
        report["torchsim"] = _attempt(torchsim_static, peer, atoms, args.device)
    ours, theirs = report["alchemi"], report["torchsim"]
    if "seconds" in ours and "seconds" in theirs:
        report["speedup"] = theirs["seconds"] / ours["seconds"]
        report["target"] = TARGET_SPEEDUP
        report["max_energy_per_atom_difference_eV"] = float(
            np.abs(ours["_energy_per_atom"] - theirs["_energy_per_atom"]).max())
    for side in ("alchemi", "torchsim"):
        report[side].pop("_energy_per_atom", None)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
