"""W7: machine-learned potentials, NVT Langevin, alchemi beside TorchSim (BENCHMARKS.md W7).

Cu FCC 3x3x3 cells (108 atoms, a = 3.61 Å, rattled 0.05 Å with the cell's index as seed), at 1,
16, 64 and 256 cells and the most that fit, 300 K, dt 1 fs, friction 0.01/fs, float32. One
model per run (MACE and SevenNet need different e3nn versions, so different environments):

* ``--model mace``: a MACE with random weights shaped like MACE-MP-0 small (seed 0), the same
  network object for alchemi (``model:mace``, step captured as a CUDA graph) and TorchSim
  (``MaceTorchSimModel``);
* ``--model sevennet``: ``7net-0`` for alchemi (``model:sevennet``, eager) and TorchSim
  (``sevenn.torchsim.SevenNetModel``).

Reported per case: ms/step and steps/s (the difference of a long and a short run, so warm-up,
capture and layout are not counted), peak device bytes per atom (``max_memory_allocated``
above the start), and alchemi's step over the model's own forward + backward on a fixed graph
(its network called on fixed edges, eagerly). TorchSim steps with ``nvt_langevin_step`` in a
loop, its model rebuilding its neighbour list every call. The largest batch is found from the
measured bytes per atom and confirmed by running it (backing off on out-of-memory).

    python -m benchmarks.w7_mlip --model mace --json out/w7_mace.json
    python -m benchmarks.w7_mlip --model sevennet --json out/w7_sevennet.json
    python -m benchmarks.w7_mlip --model mace --device cpu --quick     # does everything run?
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: Boltzmann constant (eV/K) and the internal time unit of eV, Å, amu in fs (TorchSim's).
KB = 8.617333262e-5
INTERNAL_TIME_FS = 10.1805057
SIZES = (1, 16, 64, 256)
TARGETS = {"speedup_1": 3.0, "speedup_64": 1.5, "speedup_256": 1.5, "systems_in_memory": 2.0, "step_over_fixed": 1.10}


def cu_cells(n: int) -> list[Any]:
    """``n`` Cu FCC 3x3x3 cells, rattled 0.05 Å with the cell's index as seed."""
    from alchemi_potentials.testing import copper_cells

    return copper_cells(n)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------- models
def networks(kind: str, device: str, quick: bool = False) -> tuple[Any, Any]:
    """(alchemi model, TorchSim model or the reason it is unavailable), with the same weights
    (``quick``: a much smaller MACE, for a smoke test on a CPU)."""
    if kind == "mace":
        import alchemi_mace.imports

        alchemi_mace.imports.import_mace()
        from alchemi_mace import MaceModel
        from alchemi_mace.random_model import mace_mp_small_like

        shape = {"channels": 8, "max_ell": 1, "correlation": 2} if quick else {}
        net = mace_mp_small_like(seed=0, dtype=torch.float32, **shape)
        theirs = copy.deepcopy(net)
        ours = MaceModel(net, dtype="float32")
        try:
            from mace.calculators.mace_torchsim import MaceTorchSimModel

            peer: Any = MaceTorchSimModel(theirs.to(device), device=torch.device(device), dtype=torch.float32)
        except Exception as exc:  # noqa: BLE001 - a peer that cannot run gets a reason
            peer = f"unavailable: {type(exc).__name__}: {exc}"
        return ours, peer
    from alchemi_sevennet import SevenNetModel

    ours = SevenNetModel("7net-0")
    try:
        from sevenn.torchsim import SevenNetModel as TsSevenNet

        peer = TsSevenNet("7net-0", device=device, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001
        peer = f"unavailable: {type(exc).__name__}: {exc}"
    return ours, peer


# ---------------------------------------------------------------------------------- alchemi
def alchemi_run(model: Any, atoms: list[Any], steps: int, device: str, compiled: bool) -> float:
    """Seconds of one ``run`` of ``steps`` Langevin steps on a fresh batch of ``atoms``."""
    from alchemi_core import registry
    from alchemi_core.data import Batch

    batch = Batch.from_atoms(atoms, dtype=torch.float32, device=device)
    md = registry.build("integrator:langevin", model=model, n_steps=steps, dt=1.0, temperature=300.0,
                        friction=0.01, initial_temperature=300.0, random_seed=0)
    if compiled:
        md = md.compile()
    with md:
        sync(device)
        t = time.perf_counter()
        md.run(batch)
        sync(device)
        return time.perf_counter() - t


def per_step(run: Any, short: int, long: int) -> float:
    """Seconds per step from the difference of a long and a short run (median of two)."""
    run(short)  # warm: kernels, layout, capture
    diffs = []
    for _ in range(2):
        a = run(short)
        b = run(long)
        diffs.append((b - a) / (long - short))
    return float(np.median(diffs))


def fixed_graph_seconds(model: Any, atoms: list[Any], device: str, repeats: int) -> float:
    """The network's own forward and backward (forces) on fixed edges, eager, per call."""
    from alchemi_core.data import Batch

    batch = Batch.from_atoms(atoms, dtype=torch.float32, device=device)
    edges = model.edge_list.update(batch)
    cell = batch.cell

    def once() -> None:
        x = batch.positions.detach().requires_grad_(True)
        e = model.energies(batch, x, cell, edges)
        torch.autograd.grad(e.sum(), [x])

    for _ in range(3):
        once()
    sync(device)
    t = time.perf_counter()
    for _ in range(repeats):
        once()
    sync(device)
    return (time.perf_counter() - t) / repeats


# ---------------------------------------------------------------------------------- TorchSim
def torchsim_run(peer: Any, atoms: list[Any], steps: int, device: str) -> float:
    from torch_sim.integrators.nvt import nvt_langevin_init, nvt_langevin_step
    from torch_sim.state import SimState

    dev = torch.device(device)
    n = len(atoms[0])
    state = SimState(
        positions=torch.tensor(np.concatenate([a.positions for a in atoms]), dtype=torch.float32, device=dev),
        masses=torch.tensor(np.concatenate([a.get_masses() for a in atoms]), dtype=torch.float32, device=dev),
        cell=torch.tensor(np.stack([a.cell.array.T for a in atoms]), dtype=torch.float32, device=dev),
        pbc=True,
        atomic_numbers=torch.tensor(np.concatenate([a.numbers for a in atoms]), device=dev),
        system_idx=torch.arange(len(atoms), device=dev).repeat_interleave(n),
    )
    state.rng = 0
    kt = KB * 300.0
    md = nvt_langevin_init(state, peer, kT=kt)
    dt, gamma = 1.0 / INTERNAL_TIME_FS, 0.01 * INTERNAL_TIME_FS
    sync(device)
    t = time.perf_counter()
    for _ in range(steps):
        md = nvt_langevin_step(md, peer, dt=dt, kT=kt, gamma=gamma)
    sync(device)
    return time.perf_counter() - t


# ---------------------------------------------------------------------------------- cases
def measure(run: Any, atoms_count: int, device: str, budget_s: float) -> dict[str, Any]:
    """Rate and peak memory of one framework on one case (``run(steps) -> seconds``)."""
    if device == "cuda":
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    probe = run(2)
    guess = max(probe / 2, 1e-4)
    long = int(min(200, max(4, budget_s / guess / 4)))
    short = max(2, long // 5)
    sec = per_step(run, short, long)
    out = {"ms_per_step": 1e3 * sec, "steps_per_s": 1.0 / sec, "steps": [short, long]}
    if device == "cuda":
        out["peak_bytes_per_atom"] = (torch.cuda.max_memory_allocated() - base) / atoms_count
    return out


def oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def largest(run: Any, bytes_per_atom: float, device: str, start: int) -> dict[str, Any]:
    """The most cells that run: predicted from bytes per atom, backed off by 0.8 on OOM."""
    if device != "cuda" or not bytes_per_atom:
        return {"cells": None, "reason": "needs a GPU"}
    free, _ = torch.cuda.mem_get_info()
    cells = max(start, int(0.92 * free / (bytes_per_atom * 108)))
    for _ in range(6):
        try:
            torch.cuda.empty_cache()
            sec = run(cells, 3) / 3
            return {"cells": cells, "atoms": cells * 108, "ms_per_step": 1e3 * sec}
        except Exception as exc:  # noqa: BLE001
            if not oom(exc):
                return {"cells": None, "reason": f"{type(exc).__name__}: {exc}"}
            cells = int(cells * 0.8)
            torch.cuda.empty_cache()
    return {"cells": None, "reason": "out of memory at every size tried"}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=("mace", "sevennet"), required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="1 cell, a small MACE, few steps (a smoke test)")
    p.add_argument("--budget-s", type=float, default=8.0, help="seconds of stepping per case and framework")
    args = p.parse_args(argv)
    device = args.device
    ours, peer = networks(args.model, device, args.quick)
    compiled = args.model == "mace"
    sizes = (1,) if args.quick else SIZES
    budget = 0.5 if args.quick else args.budget_s
    report: dict[str, Any] = {
        "workload": "W7", "model": args.model, "device": device, "torch": torch.__version__,
        "alchemi_compiled": compiled, "peer": "torchsim" if not isinstance(peer, str) else peer, "cases": [],
    }
    if device == "cuda":
        report["gpu"] = torch.cuda.get_device_name()

    def save() -> None:
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=1))

    for n in sizes:
        atoms = cu_cells(n)
        case: dict[str, Any] = {"cells": n, "atoms": 108 * n}
        try:
            case["alchemi"] = measure(lambda s, a=atoms: alchemi_run(ours, a, s, device, compiled), 108 * n,
                                      device, budget)
            fixed = fixed_graph_seconds(ours, atoms, device, repeats=5 if args.quick else 20)
            case["fixed_graph_ms"] = 1e3 * fixed
            case["step_over_fixed"] = case["alchemi"]["ms_per_step"] / case["fixed_graph_ms"]
        except Exception as exc:  # noqa: BLE001
            case["alchemi"] = {"error": f"{type(exc).__name__}: {exc}"}
        if not isinstance(peer, str):
            try:
                case["torchsim"] = measure(lambda s, a=atoms: torchsim_run(peer, a, s, device), 108 * n, device, budget)
            except Exception as exc:  # noqa: BLE001
                case["torchsim"] = {"error": ("out of memory" if oom(exc) else f"{type(exc).__name__}: {exc}")}
            a, t = case["alchemi"].get("steps_per_s"), case["torchsim"].get("steps_per_s")
            if a and t:
                case["speedup"] = a / t
        report["cases"].append(case)
        print(json.dumps(case), flush=True)
        save()
        if device == "cuda":
            torch.cuda.empty_cache()

    def peak(fw: str) -> float:
        values = [c[fw]["peak_bytes_per_atom"] for c in report["cases"] if "peak_bytes_per_atom" in c.get(fw, {})]
        return float(values[-1]) if values else 0.0

    if not args.quick:
        report["largest"] = {"alchemi": largest(lambda n, s: alchemi_run(ours, cu_cells(n), s, device, compiled),
                                                peak("alchemi"), device, 256)}
        if not isinstance(peer, str):
            report["largest"]["torchsim"] = largest(lambda n, s: torchsim_run(peer, cu_cells(n), s, device),
                                                    peak("torchsim"), device, 1)
        save()
    by = {c["cells"]: c for c in report["cases"]}
    met: dict[str, Any] = {}
    for n in (1, 64, 256):
        if "speedup" in by.get(n, {}):
            met[f"speedup_{n}"] = by[n]["speedup"] >= TARGETS[f"speedup_{n}"]
    big = report.get("largest", {})
    if big.get("alchemi", {}).get("cells") and big.get("torchsim", {}).get("cells"):
        met["systems_in_memory"] = big["alchemi"]["cells"] >= TARGETS["systems_in_memory"] * big["torchsim"]["cells"]
    ratios = [c["step_over_fixed"] for c in report["cases"] if "step_over_fixed" in c]
    if ratios:
        met["step_over_fixed"] = max(ratios) <= TARGETS["step_over_fixed"]
    report["targets"], report["met"] = TARGETS, met
    save()
    print(json.dumps({"largest": report.get("largest"), "met": met}), flush=True)
    return report


if __name__ == "__main__":
    main()
