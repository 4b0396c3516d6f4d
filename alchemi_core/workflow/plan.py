"""A workflow's components, built through the registry (:func:`build_plan`), and running them over
any dataset into any sinks (:func:`execute`; a data-parallel rank runs its shard so).

Example:
    >>> from alchemi_core.workflow import build_plan, execute, parse_workflow
    >>> from alchemi_core.dynamics import HostMemory
    >>> from alchemi_core.data.datapipes import ListDataset
    >>> from alchemi_core.data import AtomicData
    >>> from ase.build import bulk
    >>> wf = parse_workflow('''
    ... [model]
    ... component = "model:lennard-jones"
    ... epsilon = 0.0104
    ... sigma = 3.405
    ... cutoff = 8.5125
    ... [[stage]]
    ... component = "integrator:fire"
    ... n_steps = 50
    ... converge = { fmax = 0.05 }
    ... ''')
    >>> plan = build_plan(wf, device="cpu")
    >>> cells = [AtomicData.from_atoms(bulk("Ar", "fcc", a=5.3, cubic=True).repeat(2))] * 3
    >>> results = HostMemory(capacity=None)
    >>> summary = execute(plan, ListDataset(cells), sinks=[results], progress=False)
    >>> summary.structures_in, summary.structures_out, len(results)
    (3, 3, 3)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import attrs
import torch

from alchemi_core.errors import AlchemiError, ConfigurationError
from alchemi_core.workflow.spec import ComponentSpec, Workflow, WorkflowError


@attrs.define
class Plan:
    """Built components of a :class:`~alchemi_core.workflow.spec.Workflow`.

    Attributes:
        workflow: What was asked for.
        device: Where the run happens (``"auto"`` resolved).
        model: The model object.
        stages: One integrator per ``[[stage]]``, with the file's hooks and convergence criteria.
    """

    workflow: Workflow
    device: torch.device
    model: Any
    stages: list[Any]

    def describe(self) -> dict[str, Any]:
        """The resolved plan (what ``alchemi run --dry-run`` prints)."""
        out = self.workflow.describe()
        out["device"] = str(self.device)
        out["stages"] = [dict(d, built=repr(s)) for d, s in zip(out["stages"], self.stages, strict=True)]
        out["model"]["built"] = repr(self.model)
        return out


@attrs.frozen
class Summary:
    """What a run did: counts, steps, time, the results' energies.

    Attributes:
        structures_in: Structures of the input.
        structures_out: Of those, the ones whose result is stored (quarantined ones apart).
        written: Results this run stored (None: not counted, results kept in memory).
        already_stored: Structures skipped because the store held their result already.
        duplicated: Results stored more than once.
        stopped: What stopped the run early (``"SIGINT"``), or None when it ran to its end.
        quarantined: The structures the run took out because they went bad (``system_id``,
            ``step``, ``status``, ``reason``), stored with a negative status.
    """

    structures_in: int
    structures_out: int
    steps: int
    wall_s: float
    device: str
    mean_energy_per_atom_eV: float | None
    output: str | None
    quarantined: tuple[dict[str, Any], ...] = ()
    written: int | None = None
    already_stored: int = 0
    duplicated: int = 0
    stopped: str | None = None

    @property
    def structures_per_hour(self) -> float:
        done = self.structures_out if self.written is None else self.written
        return done / self.wall_s * 3600.0 if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "quarantined": [dict(q) for q in self.quarantined],
                "structures_per_hour": self.structures_per_hour,
                "every_structure_once": (self.structures_in == self.structures_out + len(self.quarantined)
                                         and not self.duplicated)}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"`` (or None) is ``cuda`` when there is a GPU, else ``cpu``.

    Raises:
        ConfigurationError: A CUDA device on a machine (or torch build) without one.
    """
    name = "auto" if device is None else str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigurationError(f"device {name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigurationError(
                f"device {name!r} asked for, but this torch build sees no CUDA GPU; use --device cpu (or auto)"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigurationError(f"device {name!r}: only {torch.cuda.device_count()} CUDA devices here")
    return dev


def _build(comp: ComponentSpec, source: str, **extra: Any) -> Any:
    from alchemi_core import registry

    try:
        return registry.build(comp.spec, **comp.params, **extra)
    except AlchemiError as exc:
        raise WorkflowError(comp.key, f"{comp.spec}: {' '.join(str(exc).split())}", source) from None
    except TypeError as exc:  # a parameter the signature check could not see (a component's own **kwargs)
        raise WorkflowError(comp.key, f"{comp.spec} rejected its parameters: {exc}", source) from None


def _convergence(spec: dict[str, Any] | None, key: str, source: str) -> Any:
    if not spec:
        return None
    from alchemi_core.dynamics import ConvergenceHook

    criteria = [dict(c) for c in spec.get("criteria", [])]
    for name in ("fmax", "energy_change"):
        if name in spec:
            criteria.append({"key": name, "threshold": float(spec[name])})
    try:
        return ConvergenceHook(criteria=criteria, frequency=int(spec.get("frequency", 10)))
    except AlchemiError as exc:
        raise WorkflowError(f"{key}.converge", " ".join(str(exc).split()), source) from None


def build_plan(workflow: Workflow, device: str | torch.device | None = None) -> Plan:
    """Build the model and every stage of ``workflow`` (nothing runs yet).

    Args:
        workflow: From :func:`~alchemi_core.workflow.load_workflow`.
        device: Overrides ``[run] device``.

    Raises:
        WorkflowError: A component rejected its parameters (the key and the reason).
        ConfigurationError: A device this machine does not have.
    """
    dev = resolve_device(device if device is not None else workflow.device)
    model = _build(workflow.model, workflow.source)
    to = getattr(model, "to", None)
    if callable(to) and isinstance(model, torch.nn.Module):
        model = model.to(dev)
    stages = []
    for i, st in enumerate(workflow.stages):
        hooks = [_build(h, workflow.source) for h in st.hooks]
        conv = _convergence(st.converge, f"stage[{i}]", workflow.source)
        params: dict[str, Any] = {"hooks": hooks, "convergence_hook": conv}
        if "random_seed" in _parameters(st.component) and "random_seed" not in st.component.params:
            params["random_seed"] = workflow.seed + i
        stages.append(_build(st.component, workflow.source, model=model, **params))
    return Plan(workflow=workflow, device=dev, model=model, stages=stages)


def _parameters(comp: ComponentSpec) -> set[str]:
    from alchemi_core import registry
    from alchemi_core.workflow.spec import accepted_parameters

    return set(accepted_parameters(registry.resolve(comp.spec))[0])


def execute(
    plan: Plan,
    dataset: Any,
    sinks: Sequence[Any] = (),
    *,
    progress: bool = True,
    extra_hooks: Sequence[Sequence[Any]] = (),
    checkpoint: str | None = None,
    checkpoint_every: int = 0,
    resume_from: Any = None,
    stop: Any = None,
) -> Summary:
    """Run the plan's stages, fused into one inflight stage, over ``dataset`` into ``sinks``.

    Args:
        plan: From :func:`build_plan`.
        dataset: The structures (``len``, ``[i]``, ``get_metadata(i)``), e.g. one rank's shard.
        sinks: Where finished structures go (in order, first with room first); none: kept in
            host memory and dropped after the summary.
        progress: Show a progress bar (structures done of ``len(dataset)``).
        extra_hooks: Per stage, hooks added for this run (loggers, trajectory snapshots).
        checkpoint: Write a checkpoint here every ``checkpoint_every`` steps and at the end.
        resume_from: Continue from this checkpoint (a path or a loaded state) instead.
        stop: Asked between steps; once True the run ends after its next check
            (``FusedStage.run``), with what it finished in the sinks.

    Returns:
        The run's :class:`Summary`.

    Raises:
        ConfigurationError: An empty dataset or a structure no batch can hold.
    """
    from alchemi_core import registry
    from alchemi_core.dynamics import FusedStage, HostMemory, SizeAwareSampler

    n = len(dataset)
    if n == 0:
        raise ConfigurationError("the workflow's input holds no structures")
    wf = plan.workflow
    opts = dict(wf.sampler)
    # Stages of one step (``integrator:static`` alone) hand each structure on right after it.
    one_step = all(s.n_steps == 1 and not s.forces_on_entry for s in plan.stages)
    refill = int(opts.pop("refill_frequency", 1 if one_step else 10))
    max_atoms = opts.pop("max_atoms", None)  # None: planned from the model and the memory
    stages = plan.stages
    first = stages[0]
    sizes: dict[str, Any] = {"max_atoms": max_atoms, "max_batch_size": opts.pop("max_batch_size", None),
             "bin_width": opts.pop("bin_width", 16), "workers": opts.pop("workers", 0)}
    if any(hasattr(s, "make_sampler") for s in stages[1:]):
        raise ConfigurationError(
            f"stage {next(i for i, s in enumerate(stages) if i and hasattr(s, 'make_sampler'))} samples its own "
            "structures (integrator:neb takes whole bands): make it the workflow's first stage"
        )
    # A stage that takes its structures in groups (integrator:neb: whole bands) makes its sampler.
    make_sampler = getattr(first, "make_sampler", None)
    sampler = (make_sampler(dataset, plan.device, **sizes) if make_sampler is not None
               else SizeAwareSampler(_on_device(dataset, plan.device), **sizes))
    first.sampler, first.refill_frequency = sampler, refill
    added: list[tuple[Any, Any]] = []
    for stage, hooks in zip(stages, extra_hooks, strict=False):
        for h in hooks:
            stage.hooks.append(h)
            added.append((stage, h))
    if progress:
        try:
            bar = registry.build("hook:progress", frequency=10, structures=n)
            first.hooks.append(bar)
            added.append((first, bar))
        except AlchemiError:
            pass  # no alchemi-hooks: no bar
    held = None if sinks else HostMemory(capacity=None)
    targets = list(sinks) if held is None else [held]
    fused = FusedStage([(i, s) for i, s in enumerate(stages)], sinks=targets)
    before = [len(s) for s in sinks]
    start = time.perf_counter()
    try:
        with fused:
            fused.run(checkpoint=checkpoint, checkpoint_every=checkpoint_every, resume_from=resume_from, stop=stop)
        for s in sinks:
            flush = getattr(s, "flush", None)
            if callable(flush):
                flush()
    finally:
        wall = time.perf_counter() - start
        first.sampler = None
        for stage, h in added:
            stage.hooks.remove(h)
    out = (held and len(held)) or sum(len(s) - b for s, b in zip(sinks, before, strict=True))
    bad = tuple({"system_id": q.system_id, "step": q.step, "status": q.status, "reason": q.reason}
                for q in fused.quarantined)
    energy = _mean_energy_per_atom(held) if held is not None else None
    return Summary(structures_in=n, structures_out=int(out) - len(bad), steps=fused.step_count, wall_s=wall,
                   device=str(plan.device), mean_energy_per_atom_eV=energy, output=None, quarantined=bad)


def _on_device(dataset: Any, device: torch.device) -> Any:
    from alchemi_core.data.datapipes import Dataset, ListDataset

    if isinstance(dataset, (ListDataset, Dataset)):
        dataset.device = device
        return dataset
    return Dataset(dataset, device=device)


def _mean_energy_per_atom(held: Any) -> float | None:
    if len(held) == 0:
        return None
    batch = held.read() if hasattr(held, "read") else None
    if batch is None:
        return None
    counts = torch.as_tensor(batch.num_nodes_per_system, dtype=torch.float64)
    return float((batch.energy.double().view(-1).cpu() / counts).mean())
