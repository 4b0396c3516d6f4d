"""Checks that every batched potential must pass, shared by the plugins' tests (and the W7
structures, :func:`copper_cells`).

Example:
    >>> atoms = reference_structures()
    >>> [len(a) for a in atoms]
    [32, 16, 5, 12]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


def reference_structures(seed: int = 0, rattle: float = 0.05) -> list[Any]:
    """Rattled fcc Cu (32 atoms), diamond Si (16), CH4 in a 9 Å box (open) and a Cu(111) slab
    with 6 Å of vacuum (periodic in-plane)."""
    from ase.build import bulk, fcc111, molecule

    cu = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2)
    si = bulk("Si", "diamond", a=5.43, cubic=True).repeat((2, 1, 1))
    ch4 = molecule("CH4")
    ch4.set_cell([9.0, 9.0, 9.0])
    ch4.center()
    slab = fcc111("Cu", size=(2, 2, 3), vacuum=6.0)
    slab.pbc = (True, True, False)
    out = [cu, si, ch4, slab]
    for i, atoms in enumerate(out):
        atoms.rattle(rattle, seed=seed + i)
    return out


def copper_cells(n: int, rattle: float = 0.05) -> list[Any]:
    """``n`` Cu FCC 3x3x3 cells (108 atoms, a = 3.61 Å), cell ``i`` rattled by ``rattle`` Å
    (Gaussian) with seed ``i``: the structures of benchmark W7."""
    from ase.build import bulk

    base = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(3)
    out = []
    for i in range(n):
        atoms = base.copy()
        atoms.positions += np.random.default_rng(i).normal(scale=rattle, size=atoms.positions.shape)
        out.append(atoms)
    return out


def compare_with_calculator(model: Any, calculator: Any, structures: Sequence[Any], dtype: torch.dtype, *,
                            energy_tol: float, force_tol: float, stress_tol: float,
                            device: str = "cpu") -> dict[str, float]:
    """Largest differences of the batched model from ``calculator`` (absolute: eV per system,
    eV/Å, eV/Å³), asserting each is within its tolerance; also one system alone against the
    batch. Stress is compared for systems periodic in all three directions."""
    from alchemi_core.data import Batch

    batch = Batch.from_atoms(list(structures), dtype=dtype, device=device)
    out = {k: v.detach().cpu() for k, v in model(batch, compute_stress=True).items()}
    ptr = np.concatenate(([0], np.cumsum(batch.num_nodes_per_system)))
    worst = {"energy": 0.0, "forces": 0.0, "stress": 0.0, "alone": 0.0}
    for s, atoms in enumerate(structures):
        a = atoms.copy()
        a.calc = calculator
        e = a.get_potential_energy()
        f = a.get_forces()
        worst["energy"] = max(worst["energy"], abs(float(out["energy"][s, 0]) - e))
        mine = out["forces"][ptr[s]:ptr[s + 1]].detach().numpy()
        worst["forces"] = max(worst["forces"], float(np.abs(mine - f).max()))
        if a.pbc.all():  # stress of a partly open system depends on the code's convention
            sigma = a.get_stress(voigt=False)
            worst["stress"] = max(worst["stress"], float(np.abs(out["stress"][s].detach().numpy() - sigma).max()))
    single = model(Batch.from_atoms([structures[0]], dtype=dtype, device=device))
    alone = {k: v.detach().cpu() for k, v in single.items()}
    worst["alone"] = max(abs(float(alone["energy"][0, 0] - out["energy"][0, 0])),
                         float((alone["forces"] - out["forces"][: ptr[1]]).abs().max()))
    assert worst["energy"] < energy_tol, worst
    assert worst["forces"] < force_tol, worst
    assert worst["stress"] < stress_tol, worst
    assert worst["alone"] < max(energy_tol, force_tol), worst
    return worst


def relax_then_md(model: Any, structures: Sequence[Any], dtype: torch.dtype, *, inflight: bool,
                  fire_steps: int = 30, md_steps: int = 20, fmax: float = 0.05, device: str = "cpu",
                  compiled: bool = False, extra_check: Callable[[Any], None] | None = None,
                  cell_filter: str | None = None) -> Any:
    """FIRE then Langevin (300 K, 1 fs) in one fused stage; returns the result batch.

    ``cell_filter`` (``"frechet"``, ``"unit"``) relaxes the cells too (periodic structures only).

    With ``inflight``, the structures stream through a ``SizeAwareSampler`` that holds fewer
    atoms than they have together, so finished systems make room for new ones mid-run.
    """
    from alchemi_core import registry
    from alchemi_core.data import AtomicData, Batch
    from alchemi_core.data.datapipes import ListDataset
    from alchemi_core.dynamics import ConvergenceHook, SizeAwareSampler

    sampler = None
    if inflight:
        data = [AtomicData.from_atoms(a, dtype=dtype, device=device) for a in structures]
        most = max(len(a) for a in structures)
        sampler = SizeAwareSampler(ListDataset(data), max_atoms=most + min(len(a) for a in structures),
                                   max_batch_size=None, bin_width=1)
    relax = registry.build("integrator:fire", model=model, n_steps=fire_steps, dt=0.5, dt_max=2.0,
                           convergence_hook=ConvergenceHook.from_fmax(fmax), sampler=sampler, cell_filter=cell_filter)
    md = registry.build("integrator:langevin", model=model, n_steps=md_steps, dt=1.0, temperature=300.0,
                        friction=0.01, initial_temperature=300.0, random_seed=0)
    fused = relax + md
    if compiled:
        fused = fused.compile()
    with fused:
        result = fused.run() if inflight else fused.run(Batch.from_atoms(list(structures), dtype=dtype, device=device))
    if inflight:
        ids = sorted(result.system_id.view(-1).tolist())
        assert ids == list(range(len(structures))), ids
    assert result.num_graphs == len(structures)
    assert torch.isfinite(result.positions).all() and torch.isfinite(result.forces).all()
    if extra_check is not None:
        extra_check(result)
    return result

