"""W1 (and W6 on a CPU): NVT Langevin 50 K, dt 5 fs, friction 0.01/fs, LJ argon, float32.

For each framework, on the same crystal and the same Maxwell-Boltzmann velocities:

1. build the run (untimed), warm up (compilation, CUDA-graph capture; its time is reported as
   ``warmup_s`` and the framework's time cap starts after it) and probe the step time;
2. equilibrate 1 ps, then sample the temperature every 10 steps for long enough that the mean
   over systems and samples has a standard error near 0.5 % (more steps for fewer atoms);
3. time ``repeats`` runs of S steps (S chosen so each takes about ``target_s``), each a single
   call of the framework's run API between device synchronisations: the median gives ms/step
   and atom-steps/s;
4. continue the same state with velocity Verlet and report the NVE energy drift;
5. peak device memory per atom over all of it.

When a framework is too slow for its time cap, the step counts of 2-4 shrink in proportion and
the result says so (``scaled``); the temperature check may then lack the samples to pass.

Example:
    >>> from benchmarks.w1_nvt import plan_for
    >>> plan_for(108, quick=False).sample
    4936
"""

from __future__ import annotations

import math
import time
from typing import Any

import attrs

from benchmarks import spec
from benchmarks.adapters import Framework
from benchmarks.harness import Context, attempt, ratios
from benchmarks.physics import EnergyRecorder, nve_drift, temperature_check
from benchmarks.structures import replicated_crystal
from benchmarks.timing import DeadlineExceeded, DeviceMemory, median, timed

#: Steps per sample needed so the mean temperature's standard error is ~0.5 %: about 533,000
#: atom-steps (one system's relative fluctuation is sqrt(2 / 3N); samples decorrelate in ~20 steps).
ATOM_STEPS_FOR_TEMPERATURE = 533_000


@attrs.frozen
class MDPlan:
    """Step counts of one W1 case."""

    warmup: int = 3
    probe: int = 10
    equilibrate: int = 200
    sample: int = 200
    sample_every: int = 10
    repeats: int = 5
    target_s: float = 1.0
    min_timed_steps: int = 10
    max_timed_steps: int = 20_000
    nve: int = 400
    nve_every: int = 10


def plan_for(atoms: int, quick: bool) -> MDPlan:
    """Step counts for a batch of ``atoms`` atoms."""
    sample = int(min(5000, max(200, math.ceil(ATOM_STEPS_FOR_TEMPERATURE / atoms))))
    if quick:
        return MDPlan(equilibrate=200, sample=min(sample, 2000), repeats=3, target_s=0.1, nve=100)
    return MDPlan(sample=sample)


def _measure(fw: Framework, systems: Any, ctx: Context, plan: MDPlan, cap: float) -> dict[str, Any]:
    device, atoms = ctx.device, systems.num_atoms
    memory = DeviceMemory(device)
    memory.start()
    start = time.perf_counter()
    sim = fw.md(systems, device)
    try:
        setup_s = time.perf_counter() - start
        warmup_s = timed(lambda: sim.run(plan.warmup), device)
        deadline = ctx.budget.deadline(cap)  # the cap is for measuring; compilation is reported apart
        step_s = timed(lambda: sim.run(plan.probe), device) / plan.probe
        # A second, longer probe (about a quarter of a timed run) so per-call costs such as a
        # CUDA-graph capture do not inflate the estimate that sizes the timed runs.
        longer = max(plan.probe, min(plan.max_timed_steps, round(0.25 * plan.target_s / step_s)))
        if longer > plan.probe and time.perf_counter() + longer * step_s < deadline:
            step_s = timed(lambda: sim.run(longer), device) / longer
        # Fit the remaining phases into the time left.
        steps = max(plan.min_timed_steps, min(plan.max_timed_steps, round(plan.target_s / step_s)))
        wanted = plan.equilibrate + plan.sample + plan.repeats * steps + plan.nve
        left = 0.9 * (deadline - time.perf_counter())
        scale = min(1.0, left / (wanted * step_s)) if left > 0 else 0.0
        if scale * wanted < plan.repeats * plan.min_timed_steps:
            raise DeadlineExceeded

        def scaled(n: int, least: int) -> int:
            return max(least, int(n * scale))

        every = plan.sample_every
        sim.run(scaled(plan.equilibrate, every))
        record = EnergyRecorder()
        sim.run(scaled(plan.sample, every), record, every)
        steps = scaled(steps, plan.min_timed_steps)
        seconds = median([timed(lambda: sim.run(steps), device) for _ in range(plan.repeats)])
        nve_record = EnergyRecorder()
        nve = sim.nve()
        nve.run(scaled(plan.nve, 2 * plan.nve_every), nve_record, plan.nve_every)
        nve_energies = nve_record.result()
        out = {
            "ms_per_step": 1e3 * seconds / steps,
            "atom_steps_per_s": atoms * steps / seconds,
            "steps_per_s": steps / seconds,
            "timed_steps": steps,
            "repeats": plan.repeats,
            "setup_s": setup_s,
            "warmup_s": warmup_s,
            "scaled": scale if scale < 1.0 else None,
            "temperature": temperature_check(record.result()["ke_internal"], systems.counts, spec.LANGEVIN.temperature),
            "nve": nve_drift(
                nve_energies["ke_total"], nve_energies["potential"], atoms, plan.nve_every * spec.LANGEVIN.dt_fs
            ),
        }
        out.update(memory.per_atom(atoms))
        nve.close()
        return out
    finally:
        sim.close()


def run_case(ctx: Context, workload: str, atoms_per_system: int, systems: int, cap: float) -> dict[str, Any]:
    """One shape of W1 (or W6) for every framework."""
    crystal = replicated_crystal(atoms_per_system, systems, spec.LANGEVIN.temperature, seed=0)
    plan = plan_for(crystal.num_atoms, ctx.quick)
    results = {
        name: attempt(ctx, name, cap, lambda fw, _: _measure(fw, crystal, ctx, plan, cap)) for name in ctx.frameworks
    }
    p = spec.LANGEVIN
    return {
        "id": workload,
        "case": f"{atoms_per_system}x{systems}",
        "title": (
            f"{workload} NVT Langevin {p.temperature:g} K, dt {p.dt_fs:g} fs, friction {p.friction_per_fs:g}/fs: "
            f"{atoms_per_system} atoms x {systems} systems = {crystal.num_atoms:,} atoms ({ctx.device}, float32)"
        ),
        "params": {
            "atoms_per_system": atoms_per_system,
            "systems": systems,
            "atoms": crystal.num_atoms,
            "plan": attrs.asdict(plan),
        },
        "metric": "atom_steps_per_s",
        "results": results,
        "ratios": ratios(results, "atom_steps_per_s", higher_is_better=True),
    }
