"""``run_workflow``: a validated workflow from its input to its results store, as ``alchemi run`` does.

Structures are numbered by their position in the input (``system_id``); those whose result the
store holds already are skipped, so a rerun continues an interrupted run. Every stage logs to
``<store>.log.csv`` (:func:`alchemi_core.workflow.logs.read_log`).

Example:
    >>> import os, tempfile
    >>> import ase.io
    >>> from ase.build import bulk
    >>> from alchemi_core.workflow import parse_workflow, run_workflow
    >>> folder = tempfile.mkdtemp()
    >>> ase.io.write(os.path.join(folder, "ar.extxyz"), [bulk("Ar", "fcc", a=5.3, cubic=True).repeat(2)] * 2)
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
    ... n_steps = 50
    ... [output]
    ... path = "{folder}/results.zarr"
    ... ''')
    >>> run_workflow(wf, device="cpu", progress=False).structures_out
    2
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from alchemi_core.comm.inprocess import InProcessBackend
from alchemi_core.data.datapipes import ReaderDataset, as_atomic_data
from alchemi_core.dynamics.stored import stored_results
from alchemi_core.errors import AlchemiError, ConfigurationError
from alchemi_core.parallel import DataParallelError, RankContext, SinkResults, run_data_parallel
from alchemi_core.workflow.plan import Plan, Summary, build_plan, execute
from alchemi_core.workflow.spec import Workflow, WorkflowError


class NumberedDataset(ReaderDataset):
    """A dataset whose structures get ``system_id = index``, their position in the input."""

    def __init__(self, dataset: Any) -> None:
        self.reader = dataset
        self.device = getattr(dataset, "device", None)

    def __getitem__(self, index: int) -> Any:
        data = as_atomic_data(self.reader[index], index).to(self.device)
        data.system_id = torch.tensor([int(index)], dtype=torch.long)
        return data

    def get_all_system_ids(self) -> Any:
        return np.arange(len(self), dtype=np.int64)


def log_path_for(store: str) -> Path:
    """Where the log of a run into ``store`` goes: ``results.zarr`` -> ``results.log.csv``."""
    p = Path(store)
    return p.with_name((p.stem if p.suffix == ".zarr" else p.name) + ".log.csv")


def open_input(workflow: Workflow) -> Any:
    from alchemi_core.workflow.inputs import open_dataset

    if workflow.input is None:
        raise WorkflowError("input", 'missing section: add [input] with path = "structures/*.extxyz"', workflow.source)
    spec = workflow.input
    try:
        return open_dataset(spec.path, spec.format, spec.index, spec.dtype, spec.resume_status, len(workflow.stages))
    except WorkflowError as exc:
        raise WorkflowError(exc.key, exc.message, workflow.source) from None
    except AlchemiError as exc:
        raise WorkflowError("input.path", " ".join(str(exc).split()), workflow.source) from None


def open_output(plan: Plan) -> Any:
    from alchemi_core.workflow.plan import _build

    out = plan.workflow.output
    if out is None or out.sink is None:
        return None
    return _build(out.sink, plan.workflow.source)


@attrs.frozen
class RunResult:
    """The summary of a workflow run and where its results are."""

    summary: Summary
    store: str | None
    log: str | None

    def as_dict(self) -> dict[str, Any]:
        return {**self.summary.as_dict(), "store": self.store, "log": self.log}


def run_workflow(
    workflow: Workflow, device: str | torch.device | None = None, progress: bool = True, dataset: Any = None
) -> Summary:
    """Run ``workflow`` from its ``[input]`` (or ``dataset``) into its ``[output]``.

    Raises:
        WorkflowError: A component or the input cannot be set up (named by key).
    """
    return run_workflow_detailed(workflow, device, progress, dataset).summary


def stage_hooks(plan: Plan, first: Any, sink: Any, collector: Any = None) -> list[list[Any]]:
    """Per stage, the hooks a workflow run adds: ``hook:freeze-atoms`` when the input marks
    atoms ``frozen``, trajectory snapshots into ``sink`` (``[output] trajectory_every``), and the
    log ``collector``'s loggers."""
    from alchemi_core import registry

    out = plan.workflow.output
    hooks: list[list[Any]] = [[] for _ in plan.stages]
    if first is not None and "frozen" in first:
        for h in hooks:
            h.append(registry.build("hook:freeze-atoms"))
    if out is not None and out.trajectory_every and sink is not None:
        for h in hooks:
            h.append(registry.build("hook:snapshot", sink=sink, frequency=out.trajectory_every))
    if collector is not None:
        for i, (stage, h) in enumerate(zip(plan.stages, hooks, strict=True)):
            h.append(collector.hook(i, stage))
    return hooks


def frame_statuses(workflow: Workflow) -> range:
    """Statuses of the store's trajectory frames (a stage's code), which are not results."""
    out = workflow.output
    return range(len(workflow.stages)) if out is not None and out.trajectory_every else range(0)


def run_workflow_detailed(
    workflow: Workflow, device: str | torch.device | None = None, progress: bool = True, dataset: Any = None,
    *, fresh: bool = False, stop: Callable[[], bool] | None = None,
) -> RunResult:
    """:func:`run_workflow`, returning where the store and the log are as well. A rerun into the
    store of an earlier run continues it (from its ``[checkpoint]`` where there is one): a
    data-parallel run (:func:`alchemi_core.parallel.run_data_parallel`) of one process.

    Args:
        workflow: From :func:`~alchemi_core.workflow.load_workflow`.
        device: Overrides ``[run] device``.
        progress: Show a progress bar.
        dataset: The structures (default: the workflow's ``[input]``).
        fresh: Start over: empty the store, drop the checkpoint and replace the log first.
        stop: Asked between steps; once True the run ends after its next check, with what it
            finished stored and the checkpoint written (see
            :class:`~alchemi_core.workflow.stopping.StopRequest`). ``summary.stopped`` says so.

    Raises:
        WorkflowError: A component or the input cannot be set up, the store holds another
            input's results, or the checkpoint does not fit the store (named by key).
    """
    from alchemi_core.workflow.logs import LogCollector

    plan = build_plan(workflow, device)
    data = NumberedDataset(dataset if dataset is not None else open_input(workflow))
    sink = open_output(plan)
    out = workflow.output
    if len(data) == 0:
        raise ConfigurationError("the workflow's input holds no structures")
    first = data[0]
    check = workflow.checkpoint or {}
    checkpoint, every = check.get("path"), int(check.get("every", 0))
    if sink is None:  # results kept in memory: nothing to continue
        summary = execute(plan, data, [], progress=progress, extra_hooks=stage_hooks(plan, first, None),
                          checkpoint=checkpoint, checkpoint_every=every, stop=stop)
        return RunResult(summary=summary, store=None, log=None)
    if fresh:
        _start_over(sink, checkpoint)
    _check_same_input(sink, len(data), workflow)
    resume = _resume_state(sink, checkpoint, workflow)
    results = SinkResults(sink, frame_statuses(workflow))
    before = len(results.committed_ids())
    log_file = collector = None
    if out is not None and out.log and out.path is not None and "://" not in out.path:
        log_file = log_path_for(out.path)
        collector = LogCollector(log_file, append=log_file.exists() and before > 0)
    steps: list[int] = []
    bad: list[dict[str, Any]] = []

    def make_run(ctx: RankContext) -> None:
        hooks = stage_hooks(plan, first, ctx.sink, collector)
        hooks[0].append(ctx.watch)
        summary = execute(plan, ctx.dataset, [ctx.sink], progress=progress, extra_hooks=hooks,
                          checkpoint=checkpoint, checkpoint_every=every, resume_from=resume, stop=stop)
        steps.append(summary.steps)
        bad.extend(summary.quarantined)

    backend = InProcessBackend.group(world_size=1)[0]
    try:
        dp = run_data_parallel(make_run, data, results, backend=backend, device=plan.device, stop=stop)
    except DataParallelError as exc:  # one process: its own error, not a rank's report
        raise (exc.__cause__ or exc) from None
    finally:
        backend.shutdown()
        if collector is not None:
            collector.close()
        close = getattr(sink, "close", None)
        if callable(close):
            close()
    stored = results.committed_ids()
    # Quarantined structures are stored too (with a negative status) but counted apart.
    summary = Summary(
        structures_in=len(data), structures_out=int(len(np.unique(stored[stored < len(data)]))) - len(bad),
        steps=sum(steps), quarantined=tuple(bad),
        wall_s=dp.wall_s, device=str(plan.device),
        mean_energy_per_atom_eV=_store_energy(sink, len(plan.stages)),
        output=out.path if out is not None else None, written=len(stored) - before, already_stored=dp.skipped,
        duplicated=int(len(stored) - len(np.unique(stored))), stopped=_stopped_by(stop) if dp.stopped else None,
    )
    return RunResult(summary=summary, store=out.path if out is not None else None,
                     log=str(log_file) if log_file is not None else None)


def _stopped_by(stop: Any) -> str:
    return str(getattr(stop, "signal_name", None) or "a stop request")


def _start_over(sink: Any, checkpoint: str | None) -> None:
    """``--fresh``: the store emptied, the checkpoint removed (the log is replaced after)."""
    zero = getattr(sink, "zero", None)
    if callable(zero):
        zero()
    if checkpoint is not None:
        Path(checkpoint).unlink(missing_ok=True)


def _check_same_input(sink: Any, structures: int, workflow: Workflow) -> None:
    """Refuse a store holding ids beyond the input: another input's results (or those of runs
    that appended to it), which a rerun cannot tell apart from this input's."""
    ids = stored_results(sink)
    if ids is None or not len(ids) or int(ids.max()) < structures:
        return
    where = workflow.output.path if workflow.output is not None else "the store"
    raise WorkflowError(
        "output.path", f"{where} holds system_id up to {int(ids.max())} but the input has {structures} structures: "
        "it holds the results of another input, and a rerun continues only its own. Give [output] a new path, "
        "or pass --fresh to empty it and start over", workflow.source,
    )


def _resume_state(sink: Any, checkpoint: str | None, workflow: Workflow) -> dict[str, Any] | None:
    """The ``[checkpoint]`` file's state when there is one, with the store cut back to the records
    it counted (the records written after it are written again when it continues)."""
    if checkpoint is None or not Path(checkpoint).exists():
        return None
    from alchemi_core.dynamics import checkpoint as ckpt

    try:
        state = ckpt.load(checkpoint)
        saved = state["sinks"]
        loader = getattr(sink, "load_state_dict", None)
        if len(saved) == 1 and saved[0] and callable(loader):
            loader(saved[0])
    except AlchemiError as exc:
        raise WorkflowError("checkpoint.path", f"{' '.join(str(exc).split())}; pass --fresh to start over",
                            workflow.source) from None
    return state


def _store_energy(sink: Any, exit_status: int) -> float | None:
    """The mean energy per atom of the results in the store (trajectory frames excluded)."""
    store = getattr(sink, "store", None)
    if store is None:
        return None
    store.refresh()
    n = store.num_systems
    if n == 0:
        return None
    status = store.read_rows("status", 0, n)
    rows = np.nonzero(status >= exit_status)[0]
    if not len(rows):
        return None
    energy = store.read_rows("energy", 0, n).reshape(-1)[rows]
    atom_ptr, _ = store.pointers()
    counts = (atom_ptr[1:] - atom_ptr[:-1])[rows]
    return float((energy / counts).mean())
