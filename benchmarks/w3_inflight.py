"""W3: inflight batching. Cells of 4 n³ argon atoms, n drawn from {2, 3, 4, 6} (seed 0),
rattled 0.1 Å; each is relaxed with FIRE to 0.05 eV/Å and then runs 500 NVT steps, fed to the
device through the framework's inflight batching with at most ``spec.W3_MAX_ATOMS`` atoms per
batch.

Each framework first drains a small set untimed (compilation; its time cap starts after this),
then the full set once, timed
from its run call until the last structure graduates. Checks: the structures out are the
structures in, each once (by ``system_id``), and every structure left the relaxation converged
(none used the FIRE step budget).

Example:
    >>> from benchmarks.w3_inflight import WARMUP_CELLS
    >>> WARMUP_CELLS
    64
"""

from __future__ import annotations

from typing import Any

from benchmarks import spec
from benchmarks.adapters import Framework
from benchmarks.harness import Context, attempt, ratios
from benchmarks.physics import count_check
from benchmarks.structures import ArgonCells

WARMUP_CELLS = 64
QUICK_CELLS = 24
QUICK_REPEATS = (2, 3)
QUICK_MD_STEPS = 50


def _measure(
    fw: Framework, cells: ArgonCells, warm: ArgonCells, md_steps: int, ctx: Context, cap: float
) -> dict[str, Any]:
    first = fw.inflight(warm, ctx.device, md_steps, ctx.budget.deadline(ctx.budget.remaining()))
    out = fw.inflight(cells, ctx.device, md_steps, ctx.budget.deadline(cap))
    n = len(cells)
    if not out.completed:
        done = len(out.ids_out)
        return {
            "status": "timed out",
            "reason": f"ran past its {cap:.0f} s cap: {done} of {n} structures out in {out.seconds:.0f} s "
            f"({3600.0 * done / out.seconds:.3g} structures/h so far)",
            "seconds": out.seconds,
            "structures_out": done,
        }
    return {
        "seconds": out.seconds,
        "warmup_s": first.seconds,
        "structures_per_hour": 3600.0 * n / out.seconds,
        "count": count_check(n, out.ids_out),
        "relaxed": {"converged": out.converged, "of": n, "passed": out.converged == n},
        **({"engine": out.engine} if out.engine else {}),
    }


def run_case(ctx: Context, cap: float, cells: int | None = None) -> dict[str, Any]:
    count = cells or (QUICK_CELLS if ctx.quick else spec.W3_CELLS)
    choices = QUICK_REPEATS if ctx.quick else spec.W3_REPEATS
    md_steps = QUICK_MD_STEPS if ctx.quick else spec.W3_MD_STEPS
    full = ArgonCells.drawn(count, choices)
    warm = ArgonCells.drawn(min(WARMUP_CELLS, count), choices, seed=1)
    results = {
        name: attempt(ctx, name, cap, lambda fw, _: _measure(fw, full, warm, md_steps, ctx, cap))
        for name in ctx.frameworks
    }
    atoms = int(full.atom_counts().sum())
    return {
        "id": "W3",
        "case": f"{count} cells",
        "title": (
            f"W3 inflight relax (FIRE to {spec.FIRE.fmax} eV/Å) + {md_steps} NVT steps: {count} cells, "
            f"n from {set(choices)}, {atoms:,} atoms, <= {spec.W3_MAX_ATOMS:,} atoms per batch ({ctx.device})"
        ),
        "params": {
            "cells": count,
            "repeats": list(choices),
            "atoms": atoms,
            "md_steps": md_steps,
            "relax_budget": spec.W3_RELAX_BUDGET,
            "max_atoms_per_batch": spec.W3_MAX_ATOMS,
        },
        "metric": "seconds",
        "results": results,
        "ratios": ratios(results, "seconds", higher_is_better=False),
    }
