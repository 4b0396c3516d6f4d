"""``alchemi demo``: relax a few hundred rattled argon cells, then run NVT MD, in one fused
inflight stage, and print a summary.

Everything is named through the registry (``model:lennard-jones``, ``integrator:fire``,
``integrator:langevin``), so the demo exercises the plugins exactly as a workflow file would.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click


def argon_cells(count: int, seed: int, rattle: float = 0.1) -> list[Any]:
    """``count`` FCC argon cells (a = 5.26 Å) of mixed sizes, each rattled by ``rattle`` Å."""
    import numpy as np
    import torch
    from ase.build import bulk

    from alchemi_core.data import AtomicData

    rng = np.random.default_rng(seed)
    repeats = [(2, 2, 2), (2, 2, 3), (2, 3, 3), (3, 3, 3)]  # 32, 48, 72, 108 atoms
    out = []
    for i in range(count):
        atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(repeats[int(rng.integers(len(repeats)))])
        atoms.positions += rng.normal(scale=rattle, size=atoms.positions.shape)
        data = AtomicData.from_atoms(atoms, dtype=torch.float32)
        data.system_id = torch.tensor([i])
        out.append(data)
    return out


def run_demo(structures: int, device: str, relax_steps: int, md_steps: int, temperature: float,
             fmax: float, seed: int, progress: bool) -> dict[str, Any]:
    """Run the demo workload and return its summary."""
    import torch

    from alchemi_core import registry
    from alchemi_core.data.datapipes import ListDataset
    from alchemi_core.dynamics import ConvergenceHook, SizeAwareSampler

    try:  # Warp announces itself and every kernel module it loads; the demo's output is the summary.
        import warp

        warp.config.quiet = True  # warp-lang < 1.10
        if hasattr(warp, "LOG_WARNING"):  # newer releases log through a level instead
            warp.config.log_level = warp.LOG_WARNING
    except ImportError:
        pass
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cells = argon_cells(structures, seed)
    dataset = ListDataset(cells, device=device)
    sampler = SizeAwareSampler(dataset, max_atoms=4096 if device == "cpu" else 262_144, max_batch_size=None, bin_width=16)
    model = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5125)
    hooks = []
    if progress:
        try:
            hooks.append(registry.build("hook:progress", frequency=20))  # steps: unknown in advance
        except Exception:  # noqa: BLE001 - the progress bar is optional
            pass
    relax = registry.build(
        "integrator:fire", model=model, n_steps=relax_steps, dt=5.0, sampler=sampler, refill_frequency=10,
        convergence_hook=ConvergenceHook.from_fmax(fmax, frequency=10), hooks=hooks,
    )
    md = registry.build(
        "integrator:langevin", model=model, n_steps=md_steps, dt=5.0, temperature=temperature,
        friction=0.01, random_seed=seed, initial_temperature=temperature,
    )
    fused = relax + md
    start = time.perf_counter()
    with fused:
        result = fused.run()
    wall = time.perf_counter() - start
    from alchemi_core.units import ACCELERATION, KB

    counts = torch.as_tensor(result.num_nodes_per_system, dtype=torch.float64)
    energy = result.energy.double().view(-1) / counts
    ke = 0.5 * (result.atomic_masses.double() * (result.velocities.double() ** 2).sum(-1)) / ACCELERATION
    ke_sys = torch.zeros(result.num_graphs, dtype=torch.float64).index_add_(0, result.batch_idx.cpu(), ke.cpu())
    temp = 2.0 * ke_sys / (3.0 * counts * KB)
    ids = sorted(result.system_id.tolist())
    return {
        "device": device,
        "structures_in": structures,
        "structures_out": result.num_graphs,
        "every_structure_once": ids == list(range(structures)),
        "mean_energy_per_atom_eV": float(energy.mean()),
        "mean_temperature_K": float(temp.mean()),
        "steps": fused.step_count,
        "wall_s": wall,
        "structures_per_hour": structures / wall * 3600.0,
    }


@click.command("demo")
@click.option("--structures", default=300, show_default=True, help="Rattled argon cells to process.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda or auto.")
@click.option("--relax-steps", default=300, show_default=True, help="FIRE step budget per structure.")
@click.option("--md-steps", default=100, show_default=True, help="NVT steps per structure after relaxing.")
@click.option("--temperature", default=50.0, show_default=True, help="NVT temperature (K).")
@click.option("--fmax", default=0.05, show_default=True, help="Relaxation force threshold (eV/Å).")
@click.option("--seed", default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def demo(structures: int, device: str, relax_steps: int, md_steps: int, temperature: float, fmax: float,
         seed: int, as_json: bool) -> None:
    """Relax rattled LJ argon cells with FIRE, then NVT MD, in one fused inflight stage."""
    summary = run_demo(structures, device, relax_steps, md_steps, temperature, fmax, seed, progress=not as_json)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"device                 {summary['device']}")
    click.echo(f"structures in / out    {summary['structures_in']} / {summary['structures_out']}"
               f" ({'each exactly once' if summary['every_structure_once'] else 'MISMATCH'})")
    click.echo(f"mean energy per atom   {summary['mean_energy_per_atom_eV']:.5f} eV")
    click.echo(f"mean final temperature {summary['mean_temperature_K']:.1f} K")
    click.echo(f"engine steps           {summary['steps']}")
    click.echo(f"wall time              {summary['wall_s']:.1f} s ({summary['structures_per_hour']:.3g} structures/h)")
