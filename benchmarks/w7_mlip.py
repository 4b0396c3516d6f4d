"""W7: machine-learned potentials, NVT Langevin, alchemi beside TorchSim (BENCHMARKS.md W7).

Cu FCC 3x3x3 cells (108 atoms, a = 3.61 Å, rattled 0.05 Å with the cell's index as seed), at 1,
16, 64 and 256 cells and the most that fit, 300 K, dt 1 fs, friction 0.01/fs, float32. One
model per run (MACE and SevenNet need different e3nn versions, so different environments):

* ``--model mace``: a MACE with random weights shaped like MACE-MP-0 small (seed 0), the same
  network object for alchemi (``model:mace``, step captured as a CUDA graph) and TorchSim
  (``MaceTorchSimModel``);
* ``--model sevennet``: ``7net-0`` for alchemi (``model:sevennet``, eager) and TorchSim
  (``sevenn.torchsim.SevenNetModel``);
* ``--model orb``: the orb-v3 conservative architecture (120 neighbours) with random weights
  (seed 0), the same network for alchemi (``model:orb``, eager: ORB's own graph every call) and
  TorchSim (orb-models' ``OrbTorchSimModel``; needs ``orb-models[torchsim]``, Python 3.12).

Reported per case: ms/step and steps/s at steady state (timed from the fifth step of a run, so
warm-up, capture and layout are not counted), peak device bytes per atom (``max_memory_allocated``
above the start), and alchemi's step over the model's own forward + backward on a fixed graph
(its network called on fixed edges, eagerly). TorchSim steps with ``nvt_langevin_step`` in a
loop, its model rebuilding its neighbour list every call. The largest batch is searched first,
for each framework in a fresh process: predicted from the peak memory of two short runs (16 and
48 cells; with ``--chunk-atoms``, one and three of alchemi's chunks), grown by 15 % while it runs
and backed off by 20 % on out-of-memory, up to 2,048 cells (reported as ``capped``).

cuEquivariance: where its CUDA kernels are installed (``cuequivariance-ops-torch-*``), alchemi's
model runs on them (``--cueq auto``, both models' own default; ``on``/``off`` force it), and
TorchSim is measured twice, as it comes (``torchsim``, e3nn's kernels) and with its own ``enable_cueq=True``
(``torchsim_cueq``): ``speedup`` is against the first, ``speedup_cueq`` against the second, the
same kernels on both sides.

``--chunk-atoms N`` has alchemi's model evaluate batches of more than N atoms in chunks of whole
systems (``chunk_atoms=N``), one chunk's activations held at a time.

    python -m benchmarks.w7_mlip --model mace --json out/w7_mace.json
    python -m benchmarks.w7_mlip --model sevennet --json out/w7_sevennet.json
    python -m benchmarks.w7_mlip --model orb --json out/w7_orb.json
    python -m benchmarks.w7_mlip --model mace --chunk-atoms 6912 --json out/w7_mace_chunked.json
    python -m benchmarks.w7_mlip --model mace --device cpu --quick     # does everything run?
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from alchemi_potentials.cueq import cueq_kernels_installed, runs_on_cueq

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
def networks(kind: str, device: str, quick: bool = False, chunk_atoms: int | None = None,
             cueq: bool | None = None, with_peers: bool = True) -> tuple[Any, dict[str, Any]]:
    """(alchemi model, TorchSim models by name, each a model or the reason it is unavailable),
    all with the same weights (``quick``: a much smaller MACE, for a smoke test on a CPU;
    ``chunk_atoms``: alchemi's model evaluates larger batches in chunks of whole systems;
    ``cueq``: alchemi's ``enable_cueq``; ``with_peers=False``: alchemi's model only, no
    TorchSim). With cuEquivariance's kernels in reach, TorchSim runs twice: as it comes
    (``torchsim``) and with its own ``enable_cueq=True`` (``torchsim_cueq``)."""
    peers: dict[str, Any] = {}
    if kind == "mace":
        import alchemi_mace.imports

        alchemi_mace.imports.import_mace()
        from alchemi_mace import MaceModel
        from alchemi_mace.random_model import mace_mp_small_like

        shape = {"channels": 8, "max_ell": 1, "correlation": 2} if quick else {}
        net = mace_mp_small_like(seed=0, dtype=torch.float32, **shape)
        pristine = copy.deepcopy(net)
        ours = MaceModel(net, dtype="float32", chunk_atoms=chunk_atoms, enable_cueq=cueq)
        kernels = device == "cuda" and cueq_kernels_installed()
        for name, on in (("torchsim", False), ("torchsim_cueq", True)):
            if (on and not kernels) or not with_peers:
                continue
            try:
                from mace.calculators.mace_torchsim import MaceTorchSimModel

                peers[name] = MaceTorchSimModel(copy.deepcopy(pristine).to(device), device=torch.device(device),
                                                dtype=torch.float32, enable_cueq=on)
            except Exception as exc:  # noqa: BLE001 - a peer that cannot run gets a reason
                peers[name] = f"unavailable: {type(exc).__name__}: {exc}"
        return ours, peers
    if kind == "orb":
        return orb_networks(device, quick, with_peers)
    from alchemi_sevennet import SevenNetModel

    kernels = device == "cuda" and cueq_kernels_installed()
    ours = SevenNetModel("7net-0", chunk_atoms=chunk_atoms, enable_cueq=cueq)
    for name, on in (("torchsim", False), ("torchsim_cueq", True)):
        if (on and not kernels) or not with_peers:
            continue
        try:
            from sevenn.torchsim import SevenNetModel as TsSevenNet

            peers[name] = TsSevenNet("7net-0", device=device, dtype=torch.float32, enable_cueq=on)
        except Exception as exc:  # noqa: BLE001
            peers[name] = f"unavailable: {type(exc).__name__}: {exc}"
    return ours, peers


def orb_networks(device: str, quick: bool, with_peers: bool) -> tuple[Any, dict[str, Any]]:
    """model:orb and TorchSim's ``OrbTorchSimModel`` on one orb-v3 conservative network with random
    weights (seed 0; ``quick``: narrower layers and two message passes)."""
    from alchemi_orb import OrbModel
    from orb_models.forcefield import pretrained
    from orb_models.forcefield.forcefield_adapter import ForcefieldAtomsAdapter

    torch.manual_seed(0)
    shape = {"latent_dim": 32, "base_mlp_hidden_dim": 64, "num_message_passing_steps": 2} if quick else {}
    net = pretrained.orb_v3_conservative_architecture(device="cpu", **shape)
    adapter = ForcefieldAtomsAdapter(radius=6.0, max_num_neighbors=120)
    pristine = copy.deepcopy(net)
    peers: dict[str, Any] = {}
    if with_peers:
        try:
            from orb_models.forcefield.inference.orb_torchsim import OrbTorchSimModel

            pristine.prepare_for_inference()
            peers["torchsim"] = OrbTorchSimModel(pristine, adapter, device=device, dtype=torch.float32)
        except Exception as exc:  # noqa: BLE001 - a peer that cannot run gets a reason
            peers["torchsim"] = f"unavailable: {type(exc).__name__}: {exc}"
    return OrbModel(net, atoms_adapter=adapter), peers


# ---------------------------------------------------------------------------------- alchemi
#: Steps left out of the steady rate: the first steps size buffers, warm kernels and capture.
WARM_STEPS = 4


class StepClock:
    """An ``AFTER_STEP`` hook that notes the time after every ``every``-th step (synchronising
    there, so the time is the device's), for a steady rate that leaves out the warm-up."""

    def __init__(self, every: int = 2) -> None:
        from alchemi_core.dynamics import DynamicsStage

        self.stage, self.frequency = DynamicsStage.AFTER_STEP, every
        self.times: list[tuple[int, float]] = []

    def __call__(self, batch: Any, dynamics: Any) -> None:
        if batch.positions.is_cuda:
            torch.cuda.synchronize()
        self.times.append((dynamics.step_count, time.perf_counter()))

    def seconds_per_step(self) -> float:
        steady = [(k, t) for k, t in self.times if k >= WARM_STEPS]
        (k0, t0), (k1, t1) = steady[0], steady[-1]
        return (t1 - t0) / (k1 - k0)


def langevin(model: Any, steps: int, compiled: bool, hooks: list[Any] | None = None) -> Any:
    """W7's stage: ``steps`` NVT Langevin steps of ``model`` (300 K, dt 1 fs, friction 0.01/fs,
    seed 0), captured as a CUDA graph where the model allows when ``compiled``."""
    from alchemi_core import registry

    md = registry.build("integrator:langevin", model=model, n_steps=steps, dt=1.0, temperature=300.0,
                        friction=0.01, initial_temperature=300.0, random_seed=0, hooks=hooks or [])
    return md.compile() if compiled else md


def alchemi_run(model: Any, atoms: list[Any], steps: int, device: str, compiled: bool) -> float:
    """Steady seconds per step of a run of ``steps`` Langevin steps on a fresh batch of ``atoms``."""
    from alchemi_core.data import Batch

    batch = Batch.from_atoms(atoms, dtype=torch.float32, device=device)
    clock = StepClock()
    md = langevin(model, steps, compiled, [clock])
    with md:
        md.run(batch)
    return clock.seconds_per_step()


def fixed_graph_seconds(model: Any, atoms: list[Any], device: str, repeats: int) -> float:
    """The network's own forward and backward (forces) on fixed edges, eager, per call; for a
    model that evaluates this batch in chunks, one forward and backward per chunk on its edges
    (what its step does, and all that fits)."""
    from alchemi_core.data import Batch

    batch = Batch.from_atoms(atoms, dtype=torch.float32, device=device)
    if not hasattr(model, "edge_list"):  # model:orb: its network's predict on ORB's graph, built once
        return seconds_per_call(orb_fixed_graph(model, batch), device, repeats)
    edges = model.edge_list.update(batch)
    cell = batch.cell
    chunking = model.chunking
    if chunking is not None and batch.num_nodes > chunking.max_atoms:
        parts = [(c, c.systems(cell), c.edges) for c in chunking.update(batch, edges)]
    else:
        parts = [(batch, cell, edges)]

    def once() -> None:
        for systems, part_cell, part_edges in parts:
            x = batch.positions.detach().requires_grad_(True)
            at = x if systems is batch else systems.atoms(x)
            e = model.energies(systems, at, part_cell, part_edges)
            torch.autograd.grad(e.sum(), [x])

    return seconds_per_call(once, device, repeats)


def orb_fixed_graph(model: Any, batch: Any) -> Any:
    """A call of model:orb's network (forward, forces and stress by its autograd) on one graph of
    ``batch``: its step less the graph's construction."""
    from alchemi_orb.model import atom_graphs

    model(batch)  # the network on the device
    graph = atom_graphs(batch, model.radius, model.max_num_neighbors, model.dtype, model.card.needs_charge)

    def once() -> None:
        with torch.enable_grad():
            model.network.predict(graph)

    return once


def seconds_per_call(once: Any, device: str, repeats: int) -> float:
    """Seconds per call of ``once()`` (after three warm calls)."""
    for _ in range(3):
        once()
    sync(device)
    t = time.perf_counter()
    for _ in range(repeats):
        once()
    sync(device)
    return (time.perf_counter() - t) / repeats


# ---------------------------------------------------------------------------------- TorchSim
def torchsim_state(atoms: list[Any], device: str) -> Any:
    """ASE structures as one float32 TorchSim ``SimState`` (its cells are column vectors)."""
    from torch_sim.state import SimState

    dev = torch.device(device)
    counts = torch.tensor([len(a) for a in atoms], device=dev)
    return SimState(
        positions=torch.tensor(np.concatenate([a.positions for a in atoms]), dtype=torch.float32, device=dev),
        masses=torch.tensor(np.concatenate([a.get_masses() for a in atoms]), dtype=torch.float32, device=dev),
        cell=torch.tensor(np.stack([a.cell.array.T for a in atoms]), dtype=torch.float32, device=dev),
        pbc=True,
        atomic_numbers=torch.tensor(np.concatenate([a.numbers for a in atoms]), device=dev),
        system_idx=torch.arange(len(atoms), device=dev).repeat_interleave(counts),
    )


def torchsim_run(peer: Any, atoms: list[Any], steps: int, device: str) -> float:
    """Steady seconds per step of ``steps`` TorchSim Langevin steps (the first ones left out)."""
    from torch_sim.integrators.nvt import nvt_langevin_init, nvt_langevin_step

    state = torchsim_state(atoms, device)
    state.rng = 0
    kt = KB * 300.0
    md = nvt_langevin_init(state, peer, kT=kt)
    dt, gamma = 1.0 / INTERNAL_TIME_FS, 0.01 * INTERNAL_TIME_FS
    t0 = 0.0
    for k in range(steps):
        if k == WARM_STEPS:
            sync(device)
            t0 = time.perf_counter()
        md = nvt_langevin_step(md, peer, dt=dt, kT=kt, gamma=gamma)
    sync(device)
    return (time.perf_counter() - t0) / (steps - WARM_STEPS)


# ---------------------------------------------------------------------------------- cases
def measure(run: Any, atoms_count: int, device: str, budget_s: float) -> dict[str, Any]:
    """Steady rate and peak memory of one framework on one case (``run(steps) -> s/step``): a
    short run estimates the rate, a second run of about ``budget_s`` measures it."""
    if device == "cuda":
        free_memory()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    guess = run(WARM_STEPS + 8)
    steps = WARM_STEPS + int(min(400, max(10, budget_s / max(guess, 1e-5))))
    sec = run(steps)
    out = {"ms_per_step": 1e3 * sec, "steps_per_s": 1.0 / sec, "steps": steps}
    if device == "cuda":
        out["peak_bytes_per_atom"] = (torch.cuda.max_memory_allocated() - base) / atoms_count
    return out


def free_memory() -> None:
    """Give the device memory of finished runs back to the device (a run drops its captured
    graphs when it ends; what the collector has not yet freed, and torch's cache, go here)."""
    gc.collect()
    torch.cuda.empty_cache()


def oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


#: Cells of the two short runs that measure a framework's memory before the largest-batch search
#: (with ``--chunk-atoms``, alchemi's are one and three chunks' worth instead).
PROBE_CELLS = (16, 48)
#: The search tries no more cells than this (a run of them takes under a minute on an H200);
#: a framework that runs them is reported as fitting at least that many.
MOST_CELLS = 2048


def peak_bytes(run: Any, cells: int) -> float:
    """Peak device bytes of a short run of ``cells`` cells, above what was held before it."""
    free_memory()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run(cells, WARM_STEPS + 4)
    return float(torch.cuda.max_memory_allocated() - base)


def largest(run: Any, device: str, probes: tuple[int, int] = PROBE_CELLS, most: int = MOST_CELLS) -> dict[str, Any]:
    """The most cells that run (``run(cells, steps)``): predicted from two short runs (their peak
    memory, a fixed part and a part per cell), then grown by 15 % while it fits (backed off by
    20 % on out-of-memory), never beyond ``most``."""
    if device != "cuda":
        return {"cells": None, "reason": "needs a GPU"}
    small, large = (peak_bytes(run, n) for n in probes)
    per_cell = max((large - small) / (probes[1] - probes[0]), 1.0)
    free_memory()
    free, _ = torch.cuda.mem_get_info()
    cells = max(1, min(most, probes[1] + int((0.92 * free - large) / per_cell)))
    best: dict[str, Any] = {"cells": None, "reason": "out of memory at every size tried"}
    tried: list[list[Any]] = []
    failed = False
    for _ in range(5):
        try:
            free_memory()
            sec = run(cells, WARM_STEPS + 4)
            best = {"cells": cells, "atoms": cells * 108, "ms_per_step": 1e3 * sec, "capped": cells == most}
            tried.append([cells, "ok"])
            if failed or cells == most:
                break
            cells = min(most, int(cells * 1.15))
        except Exception as exc:  # noqa: BLE001
            if not oom(exc):
                return {"cells": None, "reason": f"{type(exc).__name__}: {exc}", "tried": tried}
            tried.append([cells, "out of memory"])
            failed = True
            if best["cells"] is not None:
                break
            cells = int(cells * 0.8)
    best.update(tried=tried, probes=list(probes), probe_peak_bytes=[small, large], bytes_per_cell=per_cell)
    return best


def chunk_probes(chunk_atoms: int | None) -> tuple[int, int]:
    """Probe sizes for alchemi: one and three chunks when it evaluates in chunks (a probe within
    one chunk would see the whole network's memory per cell), else :data:`PROBE_CELLS`."""
    if chunk_atoms is None:
        return PROBE_CELLS
    per_chunk = max(1, chunk_atoms // 108)
    return per_chunk, 3 * per_chunk


def largest_in_subprocess(model: str, framework: str, device: str, chunk_atoms: int | None,
                          cueq: str = "auto") -> dict[str, Any]:
    """:func:`largest` for one framework in a fresh process, so that neither framework's
    earlier runs hold device memory during the other's search."""
    cmd = [sys.executable, "-m", "benchmarks.w7_mlip", "--model", model, "--device", device, "--largest", framework,
           "--cueq", cueq]
    if chunk_atoms is not None:
        cmd += ["--chunk-atoms", str(chunk_atoms)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"cells": None, "reason": f"exit {done.returncode}: {done.stderr[-500:]}"}
    return dict(json.loads(lines[-1]))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=("mace", "sevennet", "orb"), required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="1 cell, a small MACE or ORB, few steps (a smoke test)")
    p.add_argument("--budget-s", type=float, default=8.0, help="seconds of stepping per case and framework")
    p.add_argument("--largest", choices=("alchemi", "torchsim"), default=None,
                   help="only search the largest batch of one framework (what the full run starts in subprocesses)")
    p.add_argument("--chunk-atoms", type=int, default=None,
                   help="alchemi evaluates the model in chunks of whole systems of at most this many atoms")
    p.add_argument("--cueq", choices=("auto", "on", "off"), default="auto",
                   help="alchemi's model on cuEquivariance's kernels (auto: on a GPU where they are installed)")
    p.add_argument("--sizes", default=None,
                   help="comma-separated cell counts to run (default 1,16,64,256); given, the largest-batch search is skipped")
    args = p.parse_args(argv)
    device = args.device
    cueq = {"auto": None, "on": True, "off": False}[args.cueq]
    compiled = True  # a model whose step cannot be captured runs eagerly under compile()
    if args.largest is not None:
        ours, peers = networks(args.model, device, chunk_atoms=args.chunk_atoms, cueq=cueq)
        peer = peers["torchsim"]
        if args.largest == "alchemi":
            found = largest(lambda n, s: alchemi_run(ours, cu_cells(n), s, device, compiled), device,
                            probes=chunk_probes(args.chunk_atoms))
        elif isinstance(peer, str):
            found = {"cells": None, "reason": peer}
        else:
            found = largest(lambda n, s: torchsim_run(peer, cu_cells(n), s, device), device)
        print(json.dumps(found), flush=True)
        return found
    big: dict[str, Any] = {}
    if device == "cuda" and not args.quick and args.sizes is None:  # first, while no device memory is held
        big = {fw: largest_in_subprocess(args.model, fw, device, args.chunk_atoms, args.cueq)
               for fw in ("alchemi", "torchsim")}
    ours, peers = networks(args.model, device, args.quick, args.chunk_atoms, cueq)
    sizes = (1,) if args.quick else SIZES if args.sizes is None else tuple(int(x) for x in args.sizes.split(","))
    budget = 0.5 if args.quick else args.budget_s
    report: dict[str, Any] = {
        "workload": "W7", "model": args.model, "device": device, "torch": torch.__version__,
        "alchemi_compiled": compiled, "chunk_atoms": args.chunk_atoms,
        "peers": {name: ("ok" if not isinstance(peer, str) else peer) for name, peer in peers.items()}, "cases": [],
    }
    if device == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    if big:
        report["largest"] = big

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
        for name, peer in peers.items():
            if isinstance(peer, str):
                continue
            try:
                case[name] = measure(lambda s, a=atoms, p=peer: torchsim_run(p, a, s, device), 108 * n, device, budget)
            except Exception as exc:  # noqa: BLE001
                case[name] = {"error": ("out of memory" if oom(exc) else f"{type(exc).__name__}: {exc}")}
            a, t = case["alchemi"].get("steps_per_s"), case[name].get("steps_per_s")
            if a and t:
                case["speedup" + name.removeprefix("torchsim")] = a / t
        report["alchemi_cueq"] = runs_on_cueq(ours.network)
        report["cases"].append(case)
        print(json.dumps(case), flush=True)
        save()
        if device == "cuda":
            free_memory()

    by = {c["cells"]: c for c in report["cases"]}
    met: dict[str, Any] = {}
    for n in (1, 64, 256):
        for key in ("speedup", "speedup_cueq"):  # against TorchSim as it comes, and on the same kernels
            if key in by.get(n, {}):
                met[f"{key}_{n}"] = by[n][key] >= TARGETS[f"speedup_{n}"]
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
