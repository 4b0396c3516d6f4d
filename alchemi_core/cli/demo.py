"""``alchemi demo``: relax a few hundred rattled argon cells, then run NVT MD, in one fused
inflight stage; stream the results to ``demo-results.zarr``, print a summary table and draw
plots into ``demo-plots/``.

The demo is a workflow like any other (:data:`DEMO_WORKFLOW`, run by
:func:`alchemi_core.workflow.run_workflow_detailed`) whose structures are built in memory, so it
exercises the registry, the store, the log and the plots exactly as ``alchemi run`` does.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import click

from alchemi_core.cli.errors import reported

#: The demo's workflow; the values in braces come from the command's options.
DEMO_WORKFLOW = """\
[model]
component = "model:lennard-jones"
epsilon = 0.0104
sigma = 3.405
cutoff = 8.5125

[[stage]]
component = "integrator:fire"
n_steps = {relax_steps}
dt = 5.0
converge = {{ fmax = {fmax}, frequency = 10 }}

[[stage]]
component = "integrator:langevin"
n_steps = {md_steps}
dt = 5.0
temperature = {temperature}
friction = 0.01
initial_temperature = {temperature}

[output]
path = "{output}"

[run]
seed = {seed}
"""


def argon_cells(count: int, seed: int, rattle: float = 0.1) -> list[Any]:
    """``count`` FCC argon cells (a = 5.26 Å) of mixed sizes, each rattled by ``rattle`` Å (numpy
    only: the demo needs no ASE)."""
    import numpy as np
    import torch

    from alchemi_core.data import AtomicData

    a = 5.26
    basis = a * np.array([[0.0, 0.0, 0.0], [0.0, 0.5, 0.5], [0.5, 0.0, 0.5], [0.5, 0.5, 0.0]])
    rng = np.random.default_rng(seed)
    repeats = [(2, 2, 2), (2, 2, 3), (2, 3, 3), (3, 3, 3)]  # 32, 48, 72, 108 atoms
    out = []
    for _ in range(count):
        n = repeats[int(rng.integers(len(repeats)))]
        cells = a * np.array([(i, j, k) for i in range(n[0]) for j in range(n[1]) for k in range(n[2])], dtype=float)
        positions = (cells[:, None, :] + basis[None, :, :]).reshape(-1, 3)
        positions += rng.normal(scale=rattle, size=positions.shape)
        out.append(AtomicData(
            atomic_numbers=torch.full((len(positions),), 18, dtype=torch.long),
            positions=torch.tensor(positions, dtype=torch.float32),
            cell=torch.tensor(np.diag(np.array(n, dtype=float) * a), dtype=torch.float32),
            pbc=torch.ones(3, dtype=torch.bool),
        ))
    return out


def _clear_store(path: Path) -> None:
    """Remove an earlier demo's store (only something that is a Zarr store)."""
    if path.is_dir() and (path / "zarr.json").exists():
        shutil.rmtree(path)
    elif path.exists():
        raise click.UsageError(f"{path} exists and is not a Zarr store; choose another --output")


def final_table(store: str) -> tuple[list[dict[str, Any]], float]:
    """Per size of cell: count, mean energy per atom, mean final temperature (3N - 3 degrees of
    freedom, as Langevin with fix_com thermalises); and the overall mean temperature."""
    import numpy as np

    from alchemi_core.units import AMU_A2_PER_FS2_TO_EV, KB
    from alchemi_core.workflow.results import open_store

    batch = open_store(store).read_batch()
    n = np.asarray(batch.num_nodes_per_system)
    v, m = batch.velocities.double(), batch.atomic_masses.double()
    ke_atom = 0.5 * AMU_A2_PER_FS2_TO_EV * m * (v * v).sum(-1)
    ke = np.zeros(len(n))
    np.add.at(ke, batch.batch_idx.numpy(), ke_atom.numpy())
    temperature = 2 * ke / ((3 * n - 3) * KB)
    energy = batch.energy.double().view(-1).numpy() / n
    rows = []
    for size in sorted(set(n.tolist())):
        sel = n == size
        rows.append({"atoms": size, "structures": int(sel.sum()), "energy_per_atom_eV": float(energy[sel].mean()),
                     "temperature_K": float(temperature[sel].mean())})
    return rows, float(temperature.mean())


def run_demo(structures: int, device: str, relax_steps: int, md_steps: int, temperature: float, fmax: float,
             seed: int, progress: bool, output: str = "demo-results.zarr",
             plots: str | None = "demo-plots") -> dict[str, Any]:
    """Run the demo workload and return its summary."""
    from alchemi_core.data.datapipes import ListDataset
    from alchemi_core.workflow import parse_workflow, run_workflow_detailed
    from alchemi_core.workflow.results import plot_results

    _clear_store(Path(output))
    wf = parse_workflow(DEMO_WORKFLOW.format(relax_steps=relax_steps, md_steps=md_steps, temperature=float(temperature),
                                             fmax=float(fmax), output=Path(output).as_posix(), seed=seed),
                        source="alchemi demo")
    result = run_workflow_detailed(wf, device, progress=progress, dataset=ListDataset(argon_cells(structures, seed)))
    summary = result.as_dict()
    table, mean_t = final_table(output)
    summary["mean_temperature_K"] = mean_t
    summary["by_size"] = table
    if plots:
        summary["plots"] = [str(p) for p in plot_results(output, plots)]
    return summary


@click.command("demo")
@click.option("--structures", default=300, show_default=True, type=click.IntRange(min=1),
              help="Rattled argon cells to process.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--relax-steps", default=300, show_default=True, type=click.IntRange(min=0),
              help="FIRE step budget per structure.")
@click.option("--md-steps", default=100, show_default=True, type=click.IntRange(min=0),
              help="NVT steps per structure after relaxing.")
@click.option("--temperature", default=50.0, show_default=True, type=click.FloatRange(min=0.0),
              help="NVT temperature (K).")
@click.option("--fmax", default=0.05, show_default=True, type=click.FloatRange(min=0.0, min_open=True),
              help="Relaxation force threshold (eV/Å).")
@click.option("--seed", default=0, show_default=True)
@click.option("--output", default="demo-results.zarr", show_default=True, help="The results store (replaced).")
@click.option("--plots", default="demo-plots", show_default=True, help="Directory for the PNG plots ('' for none).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@reported
def demo(structures: int, device: str, relax_steps: int, md_steps: int, temperature: float, fmax: float,
         seed: int, output: str, plots: str, as_json: bool) -> None:
    """Relax rattled LJ argon cells with FIRE, then NVT MD, in one fused inflight stage; store,
    summarise and plot the results."""
    from alchemi_core.cli.listing import render_table
    from alchemi_core.cli.run import summary_lines

    summary = run_demo(structures, device, relax_steps, md_steps, temperature, fmax, seed, progress=not as_json,
                       output=output, plots=plots or None)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    lines = summary_lines(summary)
    lines.insert(3, f"mean final temperature {summary['mean_temperature_K']:.1f} K")
    click.echo("\n".join(lines))
    click.echo("")
    rows = [[str(r["atoms"]), str(r["structures"]), f"{r['energy_per_atom_eV']:.5f}", f"{r['temperature_K']:.1f}"]
            for r in summary["by_size"]]
    click.echo(render_table(["atoms", "structures", "energy/atom (eV)", "final T (K)"], rows))
    if summary.get("plots"):
        click.echo("")
        click.echo(f"plots                  {', '.join(summary['plots'])}")
    click.echo(f"next                   alchemi inspect {output}   |   alchemi export {output} final.extxyz")
