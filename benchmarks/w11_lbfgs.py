"""W11: L-BFGS relaxation of positions and cell, alchemi beside TorchSim and ASE (BENCHMARKS.md W11).

1,000 Cu FCC 3x3x3 cells of the W7 kind (108 atoms, a = 3.61 Å, rattled 0.05 Å with the cell's
index as seed), cell ``i`` strained by a factor drawn uniformly in [0.97, 1.03]
(``numpy.random.default_rng(i)``, the W8 rule), relaxed in positions and cell (Frechet filter)
with L-BFGS, ASE's parameters (``maxstep`` 0.2 Å, ``alpha`` 70, ``memory`` 100 unless
``--memory``), until every cell's fmax over atoms and cell rows is at most 0.05 eV/Å; float32,
``7net-0``.

* **alchemi**: ``integrator:lbfgs`` with ``cell_filter="frechet"``, the step captured as a CUDA
  graph where the model allows (else eager, reported), every structure leaving when it converges.
* **TorchSim**: ``lbfgs_init``/``lbfgs_step`` in ASE's mode (``alpha=70``, ``step_size=1``,
  ``max_history`` = the memory) on its Frechet filter, stepped until every structure converged
  (or ``--peer-cap-s`` passes), the same weights (``sevenn.torchsim``).
* **nvalchemi-toolkit 0.3.0**: its L-BFGS is not driven here yet (its API is not wrapped by
  ``benchmarks.adapters.nvalchemi``); the report says so instead of a number.
* **ASE** (``ase.optimize.LBFGS`` on ``FrechetCellFilter``, one structure at a time): the steps of
  the first ``--ase-structures`` structures, against which alchemi's steps per structure are
  compared (target: at most ASE's + 10 %).

Reported: wall time (one untimed warm-up run on a few structures first), steps per structure
(mean and largest), structures converged, the largest final fmax, structures out = in; the
speed-up over the faster peer (target >= 2).

    python -m benchmarks.w11_lbfgs --json w11.json                  # GPU, 7net-0, 1,000 cells
    python -m benchmarks.w11_lbfgs --quick --model emt --device cpu # does everything run?
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.timing import synchronize, timed_compiled_or_eager

FMAX = 0.05
STRAIN = (0.97, 1.03)
MAX_STEPS = 2000
TARGETS = {"speedup": 2.0, "steps_over_ase": 1.10}


def crystals(n: int) -> list[Any]:
    """W11's start: W7's rattled Cu cells, each strained by its own factor in [0.97, 1.03]."""
    from alchemi_potentials.testing import copper_cells

    out = []
    for i, atoms in enumerate(copper_cells(n)):
        s = float(np.random.default_rng(i).uniform(*STRAIN))
        atoms.set_cell(atoms.cell * s, scale_atoms=True)
        out.append(atoms)
    return out


# ---------------------------------------------------------------------------------- models
def models(kind: str, device: str) -> tuple[Any, Any, Any]:
    """(alchemi model, TorchSim model or the reason there is none, ASE calculator factory)."""
    if kind == "emt":  # a CPU smoke test: ASE's EMT on both sides, no TorchSim
        from ase.calculators.emt import EMT

        from alchemi_potentials.ase_model import AseCalculatorModel

        return AseCalculatorModel(EMT), "unavailable: --model emt has no TorchSim model", EMT
    from alchemi_sevennet import SevenNetModel

    ours = SevenNetModel("7net-0")
    try:
        from sevenn.torchsim import SevenNetModel as TsSevenNet

        peer: Any = TsSevenNet("7net-0", device=device, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001 - a peer that cannot run gets a reason
        peer = f"unavailable: {type(exc).__name__}: {exc}"

    def calculator() -> Any:
        from sevenn.calculator import SevenNetCalculator

        return SevenNetCalculator("7net-0", device=device)

    return ours, peer, calculator


# ---------------------------------------------------------------------------------- alchemi
def alchemi_relax(model: Any, atoms: list[Any], device: str, memory: int) -> dict[str, Any]:
    from alchemi_core.data import Batch
    from alchemi_core.dynamics import ConvergenceHook
    from alchemi_integrators import LBFGS
    from alchemi_integrators.cell_filter import CELL_FILTER_FMAX
    from alchemi_integrators.quasi_newton import QN_STEPS

    def make() -> tuple[Any, Any]:
        return LBFGS(model, n_steps=MAX_STEPS, memory=memory, cell_filter="frechet",
                     convergence_hook=ConvergenceHook.from_fmax(FMAX)), \
            Batch.from_atoms(atoms, dtype=torch.float32).to(device)

    seconds, _, batch, graph_error = timed_compiled_or_eager(make, device)
    steps = getattr(batch, QN_STEPS).cpu().numpy()
    order = np.argsort(batch.system_id.cpu().numpy())  # steps in input order
    return {"seconds": seconds, "steps": steps[order].tolist(), "mean_steps": float(steps.mean()),
            "max_steps": int(steps.max()), "converged": int((batch.status >= 1).sum()),
            "max_fmax": float(getattr(batch, CELL_FILTER_FMAX).max()),
            "cuda_graph": device == "cuda" and graph_error is None, "graph_error": graph_error,
            "count": {"in": len(atoms), "out": batch.num_graphs}}


# ---------------------------------------------------------------------------------- TorchSim
def torchsim_relax(peer: Any, atoms: list[Any], device: str, memory: int, cap_s: float) -> dict[str, Any]:
    from torch_sim.optimizers.cell_filters import CellFilter
    from torch_sim.optimizers.lbfgs import lbfgs_init, lbfgs_step
    from torch_sim.runners import generate_force_convergence_fn

    from benchmarks.w7_mlip import torchsim_state

    state = torchsim_state(atoms, device)
    converged = generate_force_convergence_fn(FMAX, include_cell_forces=True)
    synchronize(device)
    t0 = time.perf_counter()
    st = lbfgs_init(state, peer, step_size=1.0, alpha=70.0, cell_filter=CellFilter.frechet)
    steps = 0
    done = converged(st)
    while steps < MAX_STEPS and not bool(done.all()) and time.perf_counter() - t0 < cap_s:
        st = lbfgs_step(st, peer, max_history=memory, max_step=0.2)
        steps += 1
        done = converged(st)
    synchronize(device)
    return {"seconds": time.perf_counter() - t0, "steps": steps, "converged": int(done.sum()),
            "timed_out": not bool(done.all()), "count": {"in": len(atoms), "out": int(st.n_systems)}}


# ---------------------------------------------------------------------------------- ASE
def ase_steps(calculator: Any, atoms: list[Any], memory: int) -> list[int]:
    """ASE's LBFGS steps on a FrechetCellFilter, structure by structure."""
    from ase.filters import FrechetCellFilter
    from ase.optimize import LBFGS as AseLBFGS

    out = []
    for a in atoms:
        a = a.copy()
        a.calc = calculator()
        opt = AseLBFGS(FrechetCellFilter(a), memory=memory, logfile=None)
        opt.run(fmax=FMAX, steps=MAX_STEPS)
        out.append(int(opt.nsteps))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=("sevennet", "emt"), default="sevennet")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--structures", type=int, default=1000)
    p.add_argument("--memory", type=int, default=100, help="L-BFGS pairs kept (ASE's default 100)")
    p.add_argument("--ase-structures", type=int, default=16, help="structures ASE relaxes for the step counts")
    p.add_argument("--peer-cap-s", type=float, default=1800.0, help="wall-time cap of a peer's relaxation")
    p.add_argument("--quick", action="store_true", help="4 structures, 2 for ASE (a smoke test)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    n = 4 if args.quick else args.structures
    n_ase = min(n, 2 if args.quick else args.ase_structures)
    device = args.device
    ours, peer, calculator = models(args.model, device)
    atoms = crystals(n)
    report: dict[str, Any] = {"workload": "W11", "model": args.model, "device": device, "structures": n,
                              "memory": args.memory, "torch": torch.__version__,
                              "nvalchemi": "not run: its L-BFGS is not wrapped by benchmarks.adapters.nvalchemi"}
    if device == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    alchemi_relax(ours, atoms[:2], device, args.memory)  # warm-up: kernels, capture, model caches
    report["alchemi"] = alchemi_relax(ours, atoms, device, args.memory)
    if isinstance(peer, str):
        report["torchsim"] = {"error": peer}
    else:
        try:
            torchsim_relax(peer, atoms[:2], device, args.memory, args.peer_cap_s)  # warm-up
            report["torchsim"] = torchsim_relax(peer, atoms, device, args.memory, args.peer_cap_s)
            report["speedup"] = report["torchsim"]["seconds"] / report["alchemi"]["seconds"]
        except Exception as exc:  # noqa: BLE001 - the peer's failure is reported, ours stands
            report["torchsim"] = {"error": f"{type(exc).__name__}: {exc}"}
    ase = ase_steps(calculator, atoms[:n_ase], args.memory)
    ours_steps = report["alchemi"]["steps"][:n_ase]
    report["ase"] = {"steps": ase, "alchemi_steps": ours_steps,
                     "steps_over_ase": max(o / max(a, 1) for o, a in zip(ours_steps, ase, strict=True))}
    a = report["alchemi"]
    report["met"] = {
        "every_structure_converged": a["converged"] == n and a["max_fmax"] <= FMAX and a["count"]["out"] == n,
        "steps_over_ase": report["ase"]["steps_over_ase"] <= TARGETS["steps_over_ase"]
        or all(o <= math.ceil(1.1 * s) for o, s in zip(ours_steps, ase, strict=True)),
        "speedup": None if "speedup" not in report else report["speedup"] >= TARGETS["speedup"],
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    return report


if __name__ == "__main__":
    main()
