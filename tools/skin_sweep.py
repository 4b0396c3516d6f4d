"""How the Verlet skin trades rebuilds against pairs: W1's Langevin run at several skins.

For each shape (``ATOMSxSYSTEMS``) and skin, alchemi alone runs W1 (LJ argon, 50 K, dt 5 fs,
compiled, a CUDA graph on GPUs): an equilibration, then ``--repeats`` timed runs of ``--steps``
steps. It reports the median ms/step and atom-steps/s, how often a system rebuilt (builds per
system per step, and the share of steps in which some system of the batch rebuilt, which is
what a step pays on a GPU: a partial rebuild's search takes about as long as a full one), the
neighbour-matrix width, the peak memory per atom and the final temperature.

    python -m tools.skin_sweep --shapes 256x1024 --skins 0.5,0.75,1.0 --json sweep.json
    python -m tools.skin_sweep --device cpu --shapes 108x64 --skins 0.5,1.0 --steps 200
    python -m tools.skin_sweep --shapes 256x1024 --skins 0.5 --lists full,half --profile 40
    python -m tools.skin_sweep --shapes 256x1024 --skins 0.5 --joins 1.0,0.9,0.8,0.7
    python -m tools.skin_sweep --shapes 256x1024 --skins 0.5 --search-trim off,on --profile 40
    python -m tools.skin_sweep --shapes 256x1024 --skins 0.5 --variants ";unroll=2"

Example:
    >>> from tools.skin_sweep import parse_shapes
    >>> parse_shapes("108x64,256x1024")
    [(108, 64), (256, 1024)]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import attrs
import torch

from alchemi_core.dynamics import DynamicsStage, Hook
from benchmarks import spec
from benchmarks.adapters.alchemi import to_batch
from benchmarks.structures import replicated_crystal
from benchmarks.timing import DeviceMemory, median, synchronize
from benchmarks.tunings import Tunings


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"108x64,256x1024"`` -> ``[(108, 64), (256, 1024)]`` (atoms per system, systems)."""
    out = []
    for token in text.split(","):
        atoms, _, systems = token.strip().lower().partition("x")
        out.append((int(atoms), int(systems)))
    return out


class _BuildTrace(Hook):
    """A hook (after every step) recording whether some system of the batch has rebuilt since
    the step before, on the device (one int per step), so the traced steps read nothing back."""

    stage = DynamicsStage.AFTER_STEP

    def __init__(self, neighbor_list: Any, steps: int, device: str) -> None:
        super().__init__(frequency=1)
        self.neighbor_list = neighbor_list
        self.any_build = torch.zeros(steps, dtype=torch.int64, device=device)
        self.last: torch.Tensor | None = None
        self.step = 0

    def __call__(self, batch: Any, dynamics: Any) -> None:
        if self.step >= len(self.any_build):
            return
        total = self.neighbor_list.builds(batch).sum()
        if self.last is not None:
            self.any_build[self.step] = (total > self.last).to(torch.int64)
            self.step += 1
        self.last = total

    def share(self) -> float | None:
        """The share of traced steps in which some system rebuilt (reads back)."""
        return float(self.any_build[: self.step].double().mean()) if self.step else None


def kernel_profile(run: Any, steps: int, top: int = 14) -> list[dict[str, Any]]:
    """GPU time per step of the ``top`` costliest kernels of ``run(steps)`` (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run(steps)
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = e.self_device_time_total / steps
        if us > 0:
            rows.append({"kernel": e.key[:90], "us_per_step": us, "calls_per_step": e.count / steps})
    rows.sort(key=lambda r: -r["us_per_step"])
    return rows[:top]


def measure(atoms: int, systems: int, skin: float, device: str, steps: int, repeats: int,
            equilibrate: int, headroom: float, profile_steps: int = 0, half: bool | None = None,
            join: float | None = None, tunings: Tunings | None = None) -> dict[str, Any]:
    """One shape at one skin (see the module's docstring); ``half``: a half or full neighbour
    list, ``join``: the list's ``join_fraction`` (None: the tuning's for either), ``tunings``:
    the choices of the model and the run (default: the device's)."""
    from alchemi_integrators import Langevin
    from alchemi_integrators.thermo import temperature
    from alchemi_potentials import LennardJones
    from alchemi_potentials.neighbors import BatchedNeighborList

    columns = spec.neighbor_columns(spec.CUTOFF + skin, headroom)
    if half:  # each pair once: half the columns (rounded up to 8)
        columns = 8 * -(-columns // 16)
    crystal = replicated_crystal(atoms, systems, spec.LANGEVIN.temperature, seed=0)
    memory = DeviceMemory(device)
    memory.start()
    batch = to_batch(crystal, device)
    tunings = tunings or Tunings.parse(device)
    nl = BatchedNeighborList(spec.CUTOFF, skin, columns, half_list=half, join_fraction=join, tuning=tunings.potentials)
    model = LennardJones(spec.EPSILON, spec.SIGMA, spec.CUTOFF, neighbor_list=nl, tuning=tunings.potentials)
    trace = _BuildTrace(nl, steps, device)
    p = spec.LANGEVIN

    def dynamics(seed: int, hooks: list[Any] | None = None, compiled: bool = True) -> Any:
        md = Langevin(model, dt=p.dt_fs, temperature=p.temperature, friction=p.friction_per_fs,
                      random_seed=seed, hooks=hooks or [], tuning=tunings.core)
        return md.compile() if compiled else md

    plain = dynamics(1)
    with plain:
        plain.run(batch, n_steps=equilibrate)
    synchronize(device)
    per_step = []
    builds0 = int(nl.builds(batch).sum())
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        with plain:
            plain.run(batch, n_steps=steps)
        synchronize(device)
        per_step.append((time.perf_counter() - start) / steps)
    builds = int(nl.builds(batch).sum()) - builds0
    # The share of steps with a rebuild, from one eager traced run (the hook reads nothing back).
    dynamics(2, [trace], compiled=False).run(batch, n_steps=steps + 1)
    ms = median(per_step) * 1e3
    total_atoms = atoms * systems
    out = {
        "atoms": atoms,
        "systems": systems,
        "skin": skin,
        "list": {None: "device default", True: "half", False: "full"}[half],
        "join_fraction": nl.join_fraction_on(torch.device(device).type),
        "columns": columns,
        "search_parts": nl._layout.search_parts if nl._layout is not None else 1,
        "search_listed": bool(nl._layout.listed) if nl._layout is not None else False,
        "search_trim": nl.tuning_on(torch.device(device).type).search_trim,
        "most_neighbors": int(nl.most_neighbors(batch).max()),
        "ms_per_step": ms,
        "atom_steps_per_s": total_atoms / (ms * 1e-3),
        "builds_per_system_step": builds / (systems * steps * repeats),
        "steps_with_a_build": trace.share(),
        "temperature_K": float(temperature(batch).mean()),
        "repeats_ms": [x * 1e3 for x in per_step],
    }
    out.update(memory.per_atom(total_atoms))
    if profile_steps and device == "cuda":
        eager = dynamics(3, compiled=False)
        out["kernels"] = kernel_profile(lambda n: eager.run(batch, n_steps=n), profile_steps)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.skin_sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="256x1024", help="comma-separated ATOMSxSYSTEMS")
    p.add_argument("--skins", default="0.5,0.75,1.0", help="comma-separated skins in Å")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    p.add_argument("--steps", type=int, default=1000, help="steps per timed run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--equilibrate", type=int, default=400, help="steps before timing (2 ps)")
    p.add_argument("--lists", default="default", help="comma-separated: default, full, half")
    p.add_argument("--search-parts", default=None,
                   help="comma-separated threads per slot of a GPU's neighbour search to compare (default: the list's)")
    p.add_argument("--search-listed", default=None,
                   help="comma-separated on/off: whether the search walks a list of the rebuilding slots "
                        "(default: the device's)")
    p.add_argument("--search-trim", default=None,
                   help="comma-separated on/off: whether the search skips bins beyond the list radius "
                        "(PotentialsTuning.search_trim; default: the device's)")
    p.add_argument("--variants", default=None,
                   help="';'-separated variants of the per-device choices, each a --tuning text: a ','-separated "
                        "list of name=value of the Tuning fields (benchmarks.tunings); an empty variant is the defaults")
    p.add_argument("--joins", default=None,
                   help="comma-separated join fractions of the neighbour list to compare (default: the device's)")
    p.add_argument("--headroom", type=float, default=1.3, help="neighbour columns over the expected count")
    p.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="also profile this many eager steps on a GPU: the costliest kernels per step")
    p.add_argument("--json", default=None, help="write the rows here (rewritten after each)")
    args = p.parse_args(argv)
    rows = []
    for atoms, systems in parse_shapes(args.shapes):
        parts_list = [None] if args.search_parts is None else [int(x) for x in args.search_parts.split(",")]
        listed_list = [None] if args.search_listed is None else [
            {"on": True, "off": False}[x.strip()] for x in args.search_listed.split(",")]
        trims = [None] if args.search_trim is None else [
            {"on": True, "off": False}[x.strip()] for x in args.search_trim.split(",")]
        joins = [None] if args.joins is None else [float(x) for x in args.joins.split(",")]
        variants = [""] if args.variants is None else [v.strip() for v in args.variants.split(";")]
        for skin, kind, parts, listed, trim, join, variant in (
                (float(s), k, n, li, tr, j, v) for s in args.skins.split(",") for k in args.lists.split(",")
                for n in parts_list for li in listed_list for tr in trims for j in joins for v in variants):
            half = {"default": None, "full": False, "half": True}[kind]
            tunings = Tunings.parse(args.device, variant)
            # Parts and listing None: the rule picks them for the batch; trim None: the variant's.
            forced = {"force_search_parts": parts}
            if listed is not None:
                forced["search_listed"] = listed
            if trim is not None:
                forced["search_trim"] = trim
            tunings = attrs.evolve(tunings, potentials=attrs.evolve(tunings.potentials, **forced))
            row = measure(atoms, systems, skin, args.device, args.steps, args.repeats, args.equilibrate,
                          args.headroom, args.profile, half, join, tunings)
            row["variant"] = variant
            rows.append(row)
            print(
                f"{atoms}x{systems} skin {skin:.2f} {row['list']} list, search in {row['search_parts']}"
                f"{' listed' if row['search_listed'] else ''}{' trimmed' if row['search_trim'] else ''}, "
                f"join {row['join_fraction']}{', ' + variant if variant else ''}: "
                f"{row['ms_per_step']:.3f} ms/step "
                f"({row['atom_steps_per_s']:.3g} atom-steps/s), builds/system/step "
                f"{row['builds_per_system_step']:.2e}, steps with a build {row['steps_with_a_build']}, "
                f"columns {row['columns']}, peak {row['peak_bytes_per_atom']} B/atom, "
                f"T {row['temperature_K']:.1f} K",
                flush=True,
            )
            if args.json:
                Path(args.json).write_text(json.dumps({"rows": rows, "args": vars(args)}, indent=1))
            if args.device == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
