"""W2: FIRE on 2048 cells of 108 argon atoms, each rattled 0.1 Å (seed = index), until every
cell's largest force is at most 0.05 eV/Å.

Each framework relaxes the same cells once untimed (compilation; its time cap starts after
this) and then ``repeats`` times from
the same start, timed from its run call to the end (device synchronised); the median is the
wall time to converge all, and structures/hour follows. The relaxed positions are checked with
an independent float64 Lennard-Jones (:mod:`benchmarks.reference`): every cell at or below the
threshold, and the count of cells out equals the count in.

Example:
    >>> from benchmarks.w2_relax import MAX_STEPS
    >>> MAX_STEPS
    2000
"""

from __future__ import annotations

from typing import Any

from benchmarks import spec
from benchmarks.adapters import Framework
from benchmarks.harness import Context, attempt, ratios
from benchmarks.physics import force_check
from benchmarks.reference import largest_forces
from benchmarks.structures import ArgonCells, Systems
from benchmarks.timing import median

MAX_STEPS = 2000
QUICK_CELLS = 8


def _measure(fw: Framework, cells: Systems, ctx: Context, repeats: int, cap: float) -> dict[str, Any]:
    device = ctx.device
    warm = fw.relax(cells, device, MAX_STEPS, ctx.budget.deadline(ctx.budget.remaining()))  # compilation
    deadline = ctx.budget.deadline(cap)
    runs = [fw.relax(cells, device, MAX_STEPS, deadline) for _ in range(repeats)]
    seconds = median([r.seconds for r in runs])
    last = runs[-1]
    fmax = largest_forces(last.positions, cells.cells, cells.counts, device)
    return {
        "seconds": seconds,
        "warmup_s": warm.seconds,
        "ms_per_step": 1e3 * seconds / max(1, last.steps),
        "steps": last.steps,
        **({"engine": last.engine} if last.engine else {}),
        "structures_per_hour": 3600.0 * cells.num_systems / seconds,
        "forces": force_check(fmax, spec.FIRE.fmax),
        # Structures out: the cells whose atoms all came back.
        "count": {
            "in": cells.num_systems,
            "out": last.positions.shape[0] // 108,
            "passed": last.positions.shape[0] == cells.num_atoms,
        },
    }


def run_case(ctx: Context, cap: float, cells: int | None = None) -> dict[str, Any]:
    count = cells or (QUICK_CELLS if ctx.quick else spec.W2_CELLS)
    systems = ArgonCells([3] * count).systems()
    repeats = 2 if ctx.quick else spec.W2_REPEAT
    results = {
        name: attempt(ctx, name, cap, lambda fw, _: _measure(fw, systems, ctx, repeats, cap)) for name in ctx.frameworks
    }
    f = spec.FIRE
    return {
        "id": "W2",
        "case": f"{count}x108",
        "title": (
            f"W2 FIRE to fmax {f.fmax} eV/Å: {count} cells of 108 atoms rattled {spec.RATTLE} Å "
            f"(ASE's FIRE parameters: dt {f.dt_ase}, dt_max {f.dt_max_ase}, maxstep {f.maxstep} Å; "
            f"{ctx.device}, float32)"
        ),
        "params": {
            "cells": count,
            "atoms_per_cell": 108,
            "max_steps": MAX_STEPS,
            "repeats": repeats,
            "fire": {"dt_fs": f.dt_fs, "dt_max_fs": f.dt_max_fs, "maxstep": f.maxstep, "fmax": f.fmax},
        },
        "metric": "seconds",
        "results": results,
        "ratios": ratios(results, "seconds", higher_is_better=False),
    }
