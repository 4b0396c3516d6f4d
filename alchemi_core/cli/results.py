"""``alchemi inspect STORE`` and ``alchemi export STORE OUT``: results out of a store.

Example::

    $ alchemi inspect results.zarr
    $ alchemi inspect results.zarr --json
    $ alchemi inspect results.zarr --plot plots/
    $ alchemi export results.zarr relaxed.extxyz
    $ alchemi export results.zarr trajectories.traj --frames all
    $ alchemi export results.zarr finished.extxyz --order stored
"""

from __future__ import annotations

import json
from typing import Any

import click

from alchemi_core.cli.errors import reported
from alchemi_core.cli.listing import render_table


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


@click.command("inspect")
@click.argument("store")
@click.option("--json", "as_json", is_flag=True, help="Print the summary and the table as JSON.")
@click.option("--plot", "plot_dir", default=None, metavar="DIR",
              help="Write energy, temperature, fmax and throughput PNGs into DIR, pressure and volume "
                   "where the log has them (NPT runs), and bands (each band's energy profile) for NEB runs.")
@click.option("--limit", default=20, show_default=True, help="Rows of the per-structure table (0: all).")
@reported
def inspect_store(store: str, as_json: bool, plot_dir: str | None, limit: int) -> None:
    """Summarise the results store STORE: counts, final energies, one row per structure."""
    from alchemi_core.workflow.results import plot_results, store_summary, structure_table

    if limit < 0:
        from alchemi_core.errors import ConfigurationError

        raise ConfigurationError(f"--limit must be >= 0, got {limit}")
    summary = store_summary(store)
    table = structure_table(store)
    plots = [str(p) for p in plot_results(store, plot_dir)] if plot_dir else []
    if as_json:
        click.echo(json.dumps({"schema_version": 1, "summary": summary, "structures": table, "plots": plots},
                              indent=2))
        return
    click.echo(f"store       {summary['store']}")
    click.echo(f"records     {summary['records']} ({summary['structures']} structures, {summary['atoms']} atoms)")
    if "energy_per_atom_eV" in summary:
        e = summary["energy_per_atom_eV"]
        click.echo(f"energy/atom mean {e['mean']:.5f} eV (min {e['min']:.5f}, max {e['max']:.5f})")
    if summary["final_status_counts"]:
        counts = ", ".join(f"status {k}: {v}" for k, v in sorted(summary["final_status_counts"].items()))
        click.echo(f"final       {counts}")
    shown = table if limit == 0 else table[:limit]
    if shown:
        headers = ["system_id", "source", "atoms", "frames", "status", "energy (eV)", "eV/atom", "fmax (eV/Å)"]
        rows = []
        for r in shown:
            source = f"{r['source_file']}:{r.get('source_index', '')}" if "source_file" in r else "-"
            rows.append([str(r["system_id"]), source, str(r["atoms"]), str(r["frames"]), _fmt(r.get("status"), "d"),
                         _fmt(r.get("energy_eV"), ".5f"), _fmt(r.get("energy_per_atom_eV"), ".5f"),
                         _fmt(r.get("fmax_eV_per_A"), ".4f")])
        click.echo("")
        click.echo(render_table(headers, rows))
        if len(shown) < len(table):
            click.echo(f"... {len(table) - len(shown)} more (--limit 0 shows all, --json gives everything)")
    for p in plots:
        click.echo(f"plot        {p}")


@click.command("export")
@click.argument("store")
@click.argument("out")
@click.option("--frames", type=click.Choice(["last", "all"]), default="last", show_default=True,
              help="Each structure's last frame, or every stored frame (trajectories).")
@click.option("--format", "fmt", type=click.Choice(["extxyz", "traj"]), default=None,
              help="Output format (default: from OUT's suffix: .extxyz/.xyz or .traj).")
@click.option("--order", type=click.Choice(["input", "stored"]), default="input", show_default=True,
              help="Structures by system_id (the input's order), or in the order they were stored (finished).")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
@reported
def export_store(store: str, out: str, frames: str, fmt: str | None, order: str, as_json: bool) -> None:
    """Write the structures of STORE to OUT (extended XYZ or ASE .traj), with their info, tags,
    charges, magnetic moments and constraints (engine state such as an optimiser's step size is
    left out). Quarantined structures are not written, and are named. A data-parallel run's store
    reads as one set."""
    from alchemi_core.workflow.results import export_structures, quarantined_ids

    n = export_structures(store, out, frames=frames, format=fmt, order=order)
    failed = quarantined_ids(store)
    if as_json:
        click.echo(json.dumps({"schema_version": 1, "store": store, "out": out, "frames": n,
                               "quarantined_not_written": failed}))
        return
    click.echo(f"wrote {n} frames to {out}")
    if failed:
        click.echo(f"not written: {len(failed)} quarantined structures (system_id {', '.join(map(str, failed))}); "
                   f"`alchemi inspect {store}` lists them with their status")
