"""``run_workflow``: a validated workflow from its input to its results store, as ``alchemi run`` does.

It opens the input (:mod:`alchemi_core.workflow.inputs`), numbers the structures after those
already in the results store (so ids stay unique when runs append to one store), holds atoms
marked ``frozen`` in every stage, logs every stage to ``<store>.log.csv`` next to the store
(step, time, energies, fmax, temperature per system; :func:`alchemi_core.workflow.logs.read_log`
loads it), optionally snapshots a trajectory into the store, and runs the fused stages.

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

from pathlib import Path
from typing import Any

import attrs
import torch

from alchemi_core.errors import AlchemiError
from alchemi_core.workflow.plan import Plan, Summary, build_plan, execute
from alchemi_core.workflow.spec import Workflow, WorkflowError


class NumberedDataset:
    """A dataset whose structures get ``system_id = offset + index`` (ids unique across runs)."""

    def __init__(self, dataset: Any, offset: int) -> None:
        self.dataset = dataset
        self.offset = int(offset)
        self.device = getattr(dataset, "device", None)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        from alchemi_core.data.datapipes import as_atomic_data

        data = as_atomic_data(self.dataset[index], index).to(self.device)
        data.system_id = torch.tensor([self.offset + int(index)], dtype=torch.long)
        return data

    def get_metadata(self, index: int) -> tuple[int, int]:
        meta = self.dataset.get_metadata(index)
        return int(meta[0]), int(meta[1])

    def get_all_metadata(self) -> Any:
        from alchemi_core.data.datapipes import all_metadata

        return all_metadata(self.dataset)


def log_path_for(store: str) -> Path:
    """Where the log of a run into ``store`` goes: ``results.zarr`` -> ``results.log.csv``."""
    p = Path(store)
    return p.with_name((p.stem if p.suffix == ".zarr" else p.name) + ".log.csv")


def next_system_id(sink: Any) -> int:
    """One more than the largest ``system_id`` already in ``sink`` (0 for an empty one)."""
    if len(sink) == 0:
        return 0
    store = getattr(sink, "store", None)
    if store is not None and hasattr(store, "read_rows"):
        ids = store.read_rows("system_id", 0, store.num_systems)
        return int(ids.max()) + 1 if len(ids) else 0
    return int(sink.read().system_id.max()) + 1


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


def run_workflow_detailed(
    workflow: Workflow, device: str | torch.device | None = None, progress: bool = True, dataset: Any = None,
    structures: Any = None,
) -> RunResult:
    """:func:`run_workflow`, returning where the store and the log are as well."""
    from alchemi_core import registry
    from alchemi_core.workflow.logs import LogCollector

    plan = build_plan(workflow, device)
    data = dataset if dataset is not None else open_input(workflow)
    sink = open_output(plan)
    out = workflow.output
    sinks = [sink] if sink is not None else []
    offset = next_system_id(sink) if sink is not None else 0
    data = NumberedDataset(data, offset)
    extra: list[list[Any]] = [[] for _ in plan.stages]
    first = data[0] if len(data) else None
    if first is not None and "frozen" in first:
        for hooks in extra:
            hooks.append(registry.build("hook:freeze-atoms"))
    log_file = None
    collector = None
    if out is not None and out.log and out.path is not None and "://" not in out.path:
        log_file = log_path_for(out.path)
        collector = LogCollector(log_file, append=log_file.exists() and offset > 0)
        for i, (stage, hooks) in enumerate(zip(plan.stages, extra, strict=True)):
            hooks.append(collector.hook(i, stage))
    if out is not None and out.trajectory_every and sink is not None:
        for hooks in extra:
            hooks.append(registry.build("hook:snapshot", sink=sink, frequency=out.trajectory_every))
    try:
        summary = execute(plan, data, sinks, progress=progress, extra_hooks=extra,
                          checkpoint=(workflow.checkpoint or {}).get("path"),
                          checkpoint_every=(workflow.checkpoint or {}).get("every", 0))
    finally:
        if collector is not None:
            collector.close()
        close = getattr(sink, "close", None)
        if callable(close):
            close()
    if sink is not None:
        summary = attrs.evolve(summary, output=out.path if out is not None else None,
                               structures_out=_finished(sink, offset, len(plan.stages)),
                               mean_energy_per_atom_eV=_store_energy(sink, offset, len(plan.stages)))
    return RunResult(summary=summary, store=out.path if out is not None else None,
                     log=str(log_file) if log_file is not None else None)


def _final_rows(sink: Any, offset: int, exit_status: int) -> Any:
    """Rows of the store written by this run as final records (trajectory frames excluded)."""
    import numpy as np

    store = getattr(sink, "store", None)
    if store is None:
        return None
    store.refresh()
    n = store.num_systems
    ids = store.read_rows("system_id", 0, n)
    status = store.read_rows("status", 0, n)
    return np.nonzero((ids >= offset) & (status >= exit_status))[0], store


def _finished(sink: Any, offset: int, exit_status: int) -> int:
    got = _final_rows(sink, offset, exit_status)
    if got is None:
        return len(sink)
    rows, _ = got
    return len(rows)


def _store_energy(sink: Any, offset: int, exit_status: int) -> float | None:
    got = _final_rows(sink, offset, exit_status)
    if got is None:
        return None
    rows, store = got
    if not len(rows):
        return None
    energy = store.read_rows("energy", 0, store.num_systems).reshape(-1)[rows]
    atom_ptr, _ = store.pointers()
    counts = (atom_ptr[1:] - atom_ptr[:-1])[rows]
    return float((energy / counts).mean())
