"""``alchemi run`` under torchrun: every rank runs the workflow on its shard into one store.

:func:`run_workflow_data_parallel` is what ``torchrun --nproc-per-node=N alchemi run
workflow.toml`` does on each rank: the ``[output]`` path becomes a sharded Zarr store with one
part per rank; running the same command again finishes only what the store lacks. Each rank
logs to ``<store>.part-0000r.log.csv``.

Example:
    >>> import os, tempfile
    >>> import ase.io
    >>> from ase.build import bulk
    >>> from alchemi_core.workflow import parse_workflow
    >>> from alchemi_core.workflow.data_parallel import run_workflow_data_parallel
    >>> folder = tempfile.mkdtemp()
    >>> ase.io.write(os.path.join(folder, "ar.extxyz"), [bulk("Ar", "fcc", a=5.3, cubic=True).repeat(2)] * 3)
    >>> wf = parse_workflow(f'''
    ... [model]
    ... component = "model:lennard-jones"
    ... epsilon = 0.0104
    ... sigma = 3.405
    ... cutoff = 8.5125
    ... [input]
    ... path = "{folder}"
    ... [[stage]]
    ... component = "integrator:fire"
    ... n_steps = 20
    ... [output]
    ... path = "{folder}/results.zarr"
    ... ''')
    >>> result = run_workflow_data_parallel(wf, device="cpu", progress=False)
    >>> result["structures_out"], result["every_structure_once"], result["ranks"]
    (3, True, 1)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from alchemi_core.errors import InvalidDataError
from alchemi_core.parallel import RankContext, run_data_parallel
from alchemi_core.workflow.plan import build_plan, execute
from alchemi_core.workflow.run import NumberedDataset, log_path_for, open_input, stage_hooks
from alchemi_core.workflow.spec import Workflow, WorkflowError


def launched_by_torchrun(environ: Any = None) -> bool:
    """True in a process torchrun (or a launcher like it) started: ``RANK`` and ``WORLD_SIZE`` set."""
    import os

    env = os.environ if environ is None else environ
    return "RANK" in env and "WORLD_SIZE" in env


def sharded_output(workflow: Workflow) -> Any:
    """The ``[output]`` store as a ``ShardedZarrStore`` (a part per rank).

    Raises:
        WorkflowError: No ``[output]`` path, or a sink other than ``sink:zarr``.
    """
    out = workflow.output
    if out is None or out.path is None:
        raise WorkflowError("output.path", 'a data-parallel run needs a results store: add [output] path = '
                            '"results.zarr"', workflow.source)
    if out.sink is not None and out.sink.spec != "sink:zarr":
        raise WorkflowError("output.component", f"a data-parallel run writes a sharded Zarr store, not "
                            f"{out.sink.spec}; leave component out (sink:zarr)", workflow.source)
    from alchemi_core import registry

    registry.resolve("sink:zarr")  # a clear error when alchemi-zarr is missing
    ShardedZarrStore = registry.resolve_export("alchemi_core.data.datapipes", "ShardedZarrStore")  # noqa: N806

    params = dict(out.sink.params) if out.sink is not None else {}
    params.pop("store", None)
    params.pop("capacity", None)
    # Trajectory frames carry a stage's status and are not results.
    frames = range(len(workflow.stages)) if out.trajectory_every else ()
    try:
        return ShardedZarrStore(out.path, frame_statuses=frames, **params)
    except InvalidDataError as exc:  # a file, a folder of other files, a foreign group: named by key
        raise WorkflowError("output.path", " ".join(str(exc).split()), workflow.source) from None


def _rank_device(workflow: Workflow, device: str | torch.device | None, ctx: RankContext) -> torch.device:
    """``auto``/``cuda`` mean this rank's GPU; ``cpu`` and ``cuda:N`` are taken as given."""
    name = str(device if device is not None else workflow.device)
    if name in ("auto", "cuda"):
        return ctx.device
    return torch.device(name)


def run_workflow_data_parallel(
    workflow: Workflow,
    device: str | torch.device | None = None,
    progress: bool = True,
    dataset: Any = None,
    timeout_s: float = 120.0,
    stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Run ``workflow`` as this rank of a data-parallel job (see the module docstring).

    Args:
        workflow: From :func:`~alchemi_core.workflow.load_workflow`.
        device: Overrides ``[run] device`` (``auto``: this rank's GPU, else the CPU).
        progress: Rank 0 prints the store's progress every 10 s.
        dataset: The structures (default: the workflow's ``[input]``), the same on every rank.
        timeout_s: Longest wait for the other ranks, and the heartbeat staleness bound.
        stop: Asked between steps; once True this rank ends after its next check with what it
            finished stored (see :class:`~alchemi_core.workflow.stopping.StopRequest`).

    Returns:
        The summary ``alchemi run`` prints (rank 0 holds the store check; ``structures_out``
        counts each structure's result in the store).

    Raises:
        WorkflowError: The workflow cannot run data parallel (named by key).
        DataParallelError: A rank failed or was lost (the structures not stored are named).
    """
    if workflow.checkpoint:
        print("[alchemi] checkpoint is not used in a data-parallel run: run the same command again to finish "
              "what a stopped run left", file=sys.stderr)
    results = sharded_output(workflow)
    data = NumberedDataset(dataset if dataset is not None else open_input(workflow))
    out = workflow.output
    assert out is not None
    steps: list[int] = []
    devices: list[str] = []

    def make_run(ctx: RankContext) -> None:
        plan = build_plan(workflow, _rank_device(workflow, device, ctx))
        devices.append(str(plan.device))
        collector = None
        if out.log and out.path is not None and "://" not in out.path:
            from alchemi_core.workflow.logs import LogCollector

            base = log_path_for(out.path)
            log = base.with_name(base.name.replace(".log.csv", f".{Path(results.part(ctx.rank)).name}.log.csv"))
            collector = LogCollector(log, append=log.exists())
        hooks = stage_hooks(plan, ctx.dataset[0], ctx.sink, collector)
        hooks[0].append(ctx.watch)
        try:
            summary = execute(plan, ctx.dataset, [ctx.sink], progress=False, extra_hooks=hooks, stop=stop)
        finally:
            if collector is not None:
                collector.close()
        steps.append(summary.steps)

    dp = run_data_parallel(make_run, data, results, timeout_s=timeout_s, progress=progress, stop=stop)
    return {
        "device": devices[0] if devices else str(device if device is not None else workflow.device),
        "ranks": dp.world_size,
        "rank": dp.rank,
        "structures_in": dp.structures,
        "structures_out": dp.committed,
        "skipped": dp.skipped,
        "ran": dp.ran,
        "every_structure_once": dp.complete if dp.rank == 0 else True,
        "missing": len(dp.missing),
        "duplicated": len(dp.duplicated),
        "already_stored": dp.skipped,
        "written": dp.committed - dp.skipped if dp.rank == 0 else None,
        "stopped": (getattr(stop, "signal_name", None) or "a stop request") if dp.stopped else None,
        "steps": sum(steps),
        "wall_s": dp.wall_s,
        "structures_per_hour": dp.ran / dp.wall_s * 3600.0 if dp.wall_s > 0 else 0.0,
        "store": out.path,
        "log": None,
    }


__all__ = ["launched_by_torchrun", "run_workflow_data_parallel", "sharded_output"]
