"""``alchemi run WORKFLOW.toml``: a workflow file from its input to its results store.

The file is validated before anything runs (see :mod:`alchemi_core.workflow.spec`); a problem
is one line naming the key and the fix, with exit status 2. ``--dry-run`` prints the resolved
plan and stops. Started by torchrun (``torchrun --nproc-per-node=4 alchemi run workflow.toml``),
every rank runs the workflow on its shard of the input into one sharded store and rank 0 prints
the summary (:mod:`alchemi_core.workflow.data_parallel`). A rerun into the same store continues
it, in one process as under torchrun; ``--fresh`` starts over. SIGINT and SIGTERM stop the run
after its next check (:mod:`alchemi_core.workflow.stopping`), with exit status 128 + the signal.

Example::

    $ alchemi run workflow.toml --dry-run
    $ alchemi run workflow.toml --device cpu --json
"""

from __future__ import annotations

import json
from typing import Any

import click

from alchemi_core.cli.errors import reported


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The human-readable summary of a run."""
    if summary["every_structure_once"]:
        once = "each exactly once"
    elif summary.get("duplicated"):
        once = f"MISMATCH: {summary['duplicated']} stored more than once"
    elif summary.get("stopped"):
        once = f"{summary['structures_in'] - summary['structures_out']} still to run"
    else:
        once = "MISMATCH: some structures are missing"
    energy = summary.get("mean_energy_per_atom_eV")
    bad = summary.get("quarantined") or []
    out = f"{summary['structures_out']} + {len(bad)} quarantined" if bad else f"{summary['structures_out']}"
    lines = [
        f"device                 {summary['device']}",
        f"structures in / out    {summary['structures_in']} / {out} ({once})",
    ]
    if bad:
        from alchemi_core.dynamics.quarantine import Quarantined, describe_quarantined

        records = [Quarantined(q["system_id"], q["step"], q["status"]) for q in bad]
        lines.append(f"quarantined            {describe_quarantined(records)} (stored with a negative status)")
    if summary.get("written") is not None:
        lines.append(f"this run               stored {summary['written']}; {summary['already_stored']} were already "
                     "in the store")
    if energy is not None:
        lines.append(f"mean energy per atom   {energy:.5f} eV")
    lines += [
        f"engine steps           {summary['steps']}",
        f"wall time              {summary['wall_s']:.1f} s ({summary['structures_per_hour']:.3g} structures/h)",
    ]
    if summary.get("ranks"):
        lines.insert(1, f"ranks                  {summary['ranks']} (data parallel)")
    if summary.get("store"):
        lines.append(f"results                {summary['store']}")
    if summary.get("log"):
        lines.append(f"log                    {summary['log']}")
    if summary.get("stopped"):
        lines.append(f"stopped by {summary['stopped']}: run the same command again to continue where it stopped "
                     "(--fresh starts over)")
    return lines


@click.command("run")
@click.argument("workflow", type=click.Path(dir_okay=False))
@click.option("--device", default=None, help="cpu, cuda, cuda:N or auto (overrides [run] device).")
@click.option("--dry-run", is_flag=True, help="Validate, build the components and print the plan; run nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan or the summary as JSON.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--fresh", is_flag=True,
              help="Start over: empty the results store, remove the checkpoint and replace the log "
                   "(default: continue them).")
@reported
def run(workflow: str, device: str | None, dry_run: bool, as_json: bool, no_progress: bool, fresh: bool) -> None:
    """Run the workflow file WORKFLOW (TOML): model, input, stages, output. The same command again
    continues in the same store (structures whose result is stored are skipped, a [checkpoint]
    continues those it held); Ctrl-C or SIGTERM stops after the next check, saving what is
    finished and the checkpoint.
    """
    from alchemi_core.workflow import build_plan, load_workflow, run_workflow_detailed
    from alchemi_core.workflow.stopping import StopRequest

    wf = load_workflow(workflow)
    if dry_run:
        plan = build_plan(wf, device)
        described = plan.describe()
        if as_json:
            click.echo(json.dumps({"schema_version": 1, "plan": described}, indent=2, default=str))
        else:
            click.echo(_plan_text(described))
        return
    from alchemi_core.workflow.data_parallel import launched_by_torchrun, run_workflow_data_parallel

    stop = StopRequest()
    if launched_by_torchrun():
        if fresh:
            raise click.UsageError("--fresh is not taken under torchrun (the ranks would race to empty the store): "
                                   "remove the store first, or give [output] a new path")
        # Every rank runs the workflow on its shard into one sharded store; rank 0 reports.
        with stop.installed():
            summary = run_workflow_data_parallel(wf, device, progress=not (as_json or no_progress), stop=stop)
        if summary["rank"] != 0:
            raise SystemExit(stop.exit_code if stop() else 0)
    else:
        import warnings

        from alchemi_core.dynamics.quarantine import QuarantineWarning

        with stop.installed(), warnings.catch_warnings():  # the summary lists the quarantined
            warnings.simplefilter("ignore", QuarantineWarning)
            summary = run_workflow_detailed(wf, device, progress=not (as_json or no_progress), fresh=fresh,
                                            stop=stop).as_dict()
    if as_json:
        click.echo(json.dumps({"schema_version": 1, **summary}, indent=2))
    else:
        click.echo("\n".join(summary_lines(summary)))
    if summary.get("stopped") and not summary["every_structure_once"] and not summary.get("duplicated"):
        raise SystemExit(stop.exit_code)
    if not summary["every_structure_once"]:
        raise SystemExit(1)


def _plan_text(plan: dict[str, Any]) -> str:
    def params(d: dict[str, Any], skip: tuple[str, ...] = ("component", "built", "hooks")) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in d.items() if k not in skip)

    lines = [f"device   {plan['device']}", f"model    {plan['model']['component']}({params(plan['model'])})"]
    if plan["input"]:
        lines.append(f"input    {plan['input']['path']} (format {plan['input']['format'] or 'from the file'}, "
                     f"frames {plan['input']['index']}, {plan['input']['dtype']})")
    for i, st in enumerate(plan["stages"]):
        lines.append(f"stage {i}  {st['component']}({params(st)})")
        for h in st["hooks"]:
            lines.append(f"         hook {h['component']}({params(h)})")
    out = plan["output"]
    if out:
        extra = f", trajectory every {out['trajectory_every']} steps" if out["trajectory_every"] else ""
        lines.append(f"output   {out['component']} {out['path'] or ''}{extra}")
    if plan["sampler"]:
        lines.append(f"sampler  {params(plan['sampler'], ())}")
    if plan["checkpoint"]:
        lines.append(f"checkpoint {plan['checkpoint']['path']} every {plan['checkpoint']['every']} steps")
    return "\n".join(lines)
