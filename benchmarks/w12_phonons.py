"""W12: finite-displacement phonons of 64 crystals, alchemi beside TorchSim's phonopy recipe (BENCHMARKS.md W12).

Crystals (:func:`crystals`): 64 primitive cells, crystal i is diamond Si (a = 5.43 Å), fcc Cu
(3.61 Å) or rocksalt NaCl (5.64 Å) in turn, its supercell 2x2x2, 3x3x3 or 4x4x4 in turn every
three crystals, its lattice scaled by 1 + 0.004 (i // 9 - 3). phonopy makes each one's
displacements (0.01 Å, ``primitive_matrix="auto"``) and force constants on both sides:

* **alchemi**: ``alchemi_properties.phonons.phonons``: the displaced supercells of all 64 crystals
  in one inflight static run (``alchemi_core.evaluate``), forces handed back to each ``Phonopy``;
* **torchsim**: TorchSim's phonopy recipe (its example "Phonon Calculations"): per crystal, the
  displaced supercells as one state (``ts.io.phonopy_to_state``), one ``model(state)`` call, the
  forces split back to phonopy.

Reported: wall time of the whole job (phonopy's work included; median of ``--repeats`` after one
untimed run), supercells and atoms evaluated, ``speedup`` (TorchSim's time over alchemi's; target
3x), ``phonopy_alone_seconds`` (phonopy's own work crystal after crystal with zero forces: the
floor of a recipe that runs phonopy in one process; alchemi spreads it over ``--workers``
processes), the largest difference of force constants between the two (eV/Å²),
and, for the first ``--check`` crystals, the largest difference from phonopy's own route through
ASE with the same model (``model.as_ase_calculator()``, one supercell at a time).

Models (one per run, as W7 builds them): ``--model mace`` (random weights shaped like MACE-MP-0
small), ``--model sevennet`` (7net-0), both float32; ``--model lj`` (a Lennard-Jones for every
element, alchemi's Warp kernels beside TorchSim's ``LennardJonesModel``: a smoke test that runs on
a CPU without any MLIP package).

    python -m benchmarks.w12_phonons --model mace --json out/w12_mace.json
    python -m benchmarks.w12_phonons --model sevennet --json out/w12_sevennet.json
    python -m benchmarks.w12_phonons --model lj --device cpu --quick     # does everything run?
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.timing import median, timed

TARGET_SPEEDUP = 3.0
#: float32 forces (about 1e-6 eV/Å) over a 0.01 Å displacement: force constants to about 1e-4.
FC_TOL_FLOAT32 = 1e-3
KINDS = (("Si", "diamond", 5.43), ("Cu", "fcc", 3.61), ("NaCl", "rocksalt", 5.64))
#: The smoke test's Lennard-Jones, one parameter set for every element (eV, Å).
LJ = {"epsilon": 0.01, "sigma": 2.2, "cutoff": 5.5}


def crystals(n: int = 64) -> list[tuple[Any, list[int]]]:
    """W12's crystals and their supercells (see the module docstring)."""
    from ase.build import bulk

    out = []
    for i in range(n):
        name, structure, a = KINDS[i % 3]
        size = 2 + (i // 3) % 3
        out.append((bulk(name, structure, a=a * (1 + 0.004 * (i // 9 - 3))), [size, size, size]))
    return out


def models(kind: str, device: str, quick: bool) -> tuple[Any, Any]:
    """(alchemi model, TorchSim model or the reason it is unavailable), with the same weights."""
    if kind == "lj":
        from alchemi_core import registry

        ours = registry.build("model:lennard-jones", shift_energy=True, **LJ)
        try:
            from torch_sim.models.lennard_jones import LennardJonesModel

            return ours, LennardJonesModel(**LJ, device=torch.device(device), dtype=torch.float32)
        except Exception as exc:  # noqa: BLE001 - a peer that cannot run gets a reason
            return ours, f"unavailable: {type(exc).__name__}: {exc}"
    from benchmarks.w7_mlip import networks

    ours, peers = networks(kind, device, quick=quick)
    return ours.to(device), peers.get("torchsim", "unavailable: TorchSim not installed")


def alchemi_job(model: Any, jobs: list[tuple[Any, list[int]]], device: str, workers: int) -> list[np.ndarray]:
    """alchemi: every crystal's force constants, all displaced supercells in one run, phonopy's work
    spread over ``workers`` processes."""
    from alchemi_properties.phonons import phonons

    sizes = {id(a): m for a, m in jobs}
    results = phonons([a for a, _ in jobs], model, supercell_matrix=lambda a: sizes[id(a)], device=device,
                      dtype=torch.float32, workers=workers)
    failed = [(r.index, r.failure) for r in results if r.failure is not None]
    if failed:
        raise RuntimeError(f"alchemi: crystals failed: {failed[:3]}")
    return [r.force_constants for r in results]


def displaced(atoms: Any, matrix: list[int]) -> Any:
    """``atoms``' ``Phonopy`` with its displacements (as alchemi's ``phonons`` makes it)."""
    from phonopy import Phonopy
    from phonopy.structure.atoms import PhonopyAtoms

    unitcell = PhonopyAtoms(symbols=atoms.get_chemical_symbols(), cell=atoms.cell[:],
                            scaled_positions=atoms.get_scaled_positions(), masses=atoms.get_masses())
    ph = Phonopy(unitcell, supercell_matrix=matrix, primitive_matrix="auto")
    ph.generate_displacements(distance=0.01)
    return ph


def torchsim_job(peer: Any, jobs: list[tuple[Any, list[int]]], device: str) -> list[np.ndarray]:
    """TorchSim's phonopy recipe, crystal after crystal: one batched model call per crystal."""
    import torch_sim as ts

    out = []
    for atoms, matrix in jobs:
        ph = displaced(atoms, matrix)
        supercells = ph.supercells_with_displacements
        results = peer(ts.io.phonopy_to_state(supercells, torch.device(device), torch.float32))
        forces, start = [], 0
        for cell in supercells:
            forces.append(results["forces"][start:start + len(cell)].detach().cpu().numpy())
            start += len(cell)
        ph.forces = forces
        ph.produce_force_constants()
        out.append(ph.force_constants)
    return out


def phonopy_alone(jobs: list[tuple[Any, list[int]]]) -> None:
    """phonopy's own work, crystal after crystal, with zero forces (no model): what every
    recipe that runs phonopy in one process pays whatever its model's speed."""
    for atoms, matrix in jobs:
        ph = displaced(atoms, matrix)
        ph.forces = np.zeros((len(ph.supercells_with_displacements), len(ph.supercell), 3))
        ph.produce_force_constants(show_drift=False)


def ase_route(model: Any, atoms: Any, matrix: list[int], device: str) -> np.ndarray:
    """phonopy's own calculation through ASE: the same model, one supercell at a time."""
    from ase import Atoms

    ph = displaced(atoms, matrix)
    calculator = model.as_ase_calculator(device=device, dtype=torch.float32)
    forces = []
    for sc in ph.supercells_with_displacements:
        supercell = Atoms(sc.symbols, cell=sc.cell, scaled_positions=sc.scaled_positions, pbc=True)
        supercell.calc = calculator
        forces.append(supercell.get_forces())
    ph.forces = forces
    ph.produce_force_constants()
    return ph.force_constants


def largest_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """The largest absolute difference between two lists of force constants (eV/Å²)."""
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def measure(job: Any, device: str, repeats: int) -> tuple[dict[str, Any], list[np.ndarray]]:
    """One untimed run, then ``repeats`` timed ones: (figures, force constants of the last)."""
    last = [job()]

    def again() -> None:
        last[0] = job()

    times = [timed(again, device) for _ in range(repeats)]
    return {"seconds": median(times), "repeats": times}, last[0]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=("mace", "sevennet", "lj"), required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--crystals", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--check", type=int, default=3, help="crystals also done through phonopy's ASE route")
    p.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1),
                   help="processes for phonopy's work on alchemi's side (phonons(workers=...))")
    p.add_argument("--quick", action="store_true", help="6 crystals, one repeat (a smoke test)")
    args = p.parse_args(argv)
    device = args.device
    n, repeats = (6, 1) if args.quick else (args.crystals, args.repeats)
    jobs = crystals(n)
    ours, peer = models(args.model, device, args.quick)
    report: dict[str, Any] = {"workload": "W12", "model": args.model, "device": device, "torch": torch.__version__,
                              "crystals": n, "torchsim": "ok" if not isinstance(peer, str) else peer}
    if device == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    report["workers"] = args.workers
    report["alchemi"], fc_ours = measure(lambda: alchemi_job(ours, jobs, device, args.workers), device, repeats)
    report["phonopy_alone_seconds"] = timed(lambda: phonopy_alone(jobs), "cpu")
    cells = [sc for a, m in jobs for sc in displaced(a, m).supercells_with_displacements]
    report["supercells"], report["atoms"] = len(cells), sum(len(sc) for sc in cells)
    checked = [ase_route(ours, a, m, device) for a, m in jobs[:args.check]]
    report["fc_vs_phonopy_ase"] = largest_difference(fc_ours[:args.check], checked)
    if not isinstance(peer, str):
        try:
            report["torchsim_run"], fc_peer = measure(lambda: torchsim_job(peer, jobs, device), device, repeats)
            report["fc_vs_torchsim"] = largest_difference(fc_ours, fc_peer)
            report["speedup"] = report["torchsim_run"]["seconds"] / report["alchemi"]["seconds"]
        except Exception as exc:  # noqa: BLE001 - the peer's failure is a row, not the end of the run
            report["torchsim_run"] = {"error": f"{type(exc).__name__}: {exc}"}
    report["met"] = {"fc_vs_phonopy_ase": report["fc_vs_phonopy_ase"] <= FC_TOL_FLOAT32}
    if "speedup" in report:
        report["met"] |= {"speedup": report["speedup"] >= TARGET_SPEEDUP,
                          "fc_vs_torchsim": report["fc_vs_torchsim"] <= FC_TOL_FLOAT32}
    print(json.dumps(report), flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    sys.exit(0 if all(main()["met"].values()) else 1)
