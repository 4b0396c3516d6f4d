"""Evaluate or relax a list of ASE structures in one call: ``evaluate`` and ``relax``.

Both run the structures inflight through a :class:`~alchemi_core.dynamics.SizeAwareSampler`
(batches sized by the model's bytes per atom), so a structure that is done (evaluated, converged,
or out of steps) leaves its batch at once and costs no more model evaluations, and return ASE
``Atoms`` in the order given, each with a ``SinglePointCalculator`` holding its energy, forces and
(when asked, or under a cell filter) stress. ``atoms.info`` holds what alchemi stores:
``system_id`` (the structure's index in the input), ``status``, and

* ``quarantine``: the reason, for a structure the model could not evaluate (positions that are
  not finite, an element it has no parameters for, atoms closer than :data:`OVERLAP_DISTANCE`:
  found before the run; a result that is not finite: found by the run's quarantine,
  :mod:`alchemi_core.dynamics.quarantine`); such a structure comes back without results, and the
  others finish;
* for ``relax``: ``converged`` (its ``fmax`` at or below the threshold), ``steps`` (FIRE steps it
  took) and ``fmax`` (eV/Å; under a cell filter, the filter's, which counts the cell's forces as
  ASE's ``FrechetCellFilter`` does).

Progress is off unless ``progress=True`` (a bar from ``alchemi-hooks``). ``relax`` builds FIRE
through the registry (``integrator:fire``, from ``alchemi-integrators``).

Example:
    >>> import torch
    >>> from ase.build import bulk, molecule
    >>> from alchemi_core import evaluate, relax
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> model = DemoModelWrapper()
    >>> structures = [molecule("H2O"), bulk("Cu", "fcc", a=3.6, cubic=True)]
    >>> done = evaluate(structures, model, dtype=torch.float64)
    >>> [a.get_chemical_formula() for a in done], done[0].get_forces().shape
    (['H2O', 'Cu4'], (3, 3))
    >>> relaxed = relax([molecule("H2O")], model, fmax=0.05, dtype=torch.float64)  # doctest: +SKIP
    >>> relaxed[0].info["converged"]  # doctest: +SKIP
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from alchemi_core.dynamics.hook import Hook
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.errors import ConfigurationError

if TYPE_CHECKING:
    import ase

    from alchemi_core.data import AtomicData, Batch
    from alchemi_core.dynamics.base import BaseDynamics

#: Atoms closer than this (Å) count as on top of each other: no model can evaluate them.
OVERLAP_DISTANCE = 0.1


def evaluate(
    structures: Sequence[ase.Atoms],
    model: Any,
    *,
    compute_stress: bool = False,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    max_atoms: int | None = None,
    max_batch_size: int | None = None,
    progress: bool = False,
) -> list[ase.Atoms]:
    """Energy, forces (and stress) of every structure, one model evaluation each.

    Args:
        structures: ASE ``Atoms``, any mix of sizes, periodic or not.
        model: An alchemi model (``registry.build("model:...")``), on the device to run on.
        compute_stress: Ask for the stress too (every structure then needs a cell).
        dtype: Floating dtype of positions and results (default: ``AtomicData.from_atoms``'s).
        device: Where to run (default: where the model's parameters are; for a model without any,
            ``cuda`` when there is a GPU, else ``cpu``).
        max_atoms: Most atoms per batch (None: planned from the device's memory and the model).
        max_batch_size: Most structures per batch (None: no limit).
        progress: Show a progress bar.

    Returns:
        New ``Atoms``, in input order, with results (see the module docstring).

    Raises:
        ConfigurationError: No structures.
    """
    from alchemi_core.dynamics.static import Static

    stage = Static(model, compute_stress=compute_stress)
    return _run(stage, structures, model, dtype, device, max_atoms, max_batch_size, progress)


def relax(
    structures: Sequence[ase.Atoms],
    model: Any,
    *,
    fmax: float = 0.05,
    cell_filter: str | None = None,
    max_steps: int = 1000,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    max_atoms: int | None = None,
    max_batch_size: int | None = None,
    progress: bool = False,
    **fire_options: Any,
) -> list[ase.Atoms]:
    """Relax every structure with FIRE until its ``fmax`` is at most ``fmax`` (or ``max_steps``).

    Args:
        structures: ASE ``Atoms``, any mix of sizes, periodic or not.
        model: An alchemi model, on the device to run on.
        fmax: Convergence threshold on the largest force (eV/Å); under a cell filter it counts the
            cell's forces too.
        cell_filter: ``"frechet"`` or ``"unit"`` to relax the cells as well (the model must give
            stress); None keeps them fixed.
        max_steps: Most FIRE steps per structure.
        dtype: Floating dtype of positions and results.
        device: Where to run (default: as for :func:`evaluate`).
        max_atoms: Most atoms per batch (None: planned from the device's memory and the model).
        max_batch_size: Most structures per batch (None: no limit).
        progress: Show a progress bar.
        **fire_options: Passed to ``integrator:fire`` (``dt``, ``dt_max``, ``maxstep``,
            ``scalar_pressure``, ...).

    Returns:
        New ``Atoms``, in input order, relaxed, with results (see the module docstring).

    Raises:
        ConfigurationError: No structures, or a FIRE option it refuses.
    """
    from alchemi_core import registry
    from alchemi_core.dynamics import ConvergenceHook

    stage = registry.build(
        "integrator:fire", model=model, n_steps=max_steps, cell_filter=cell_filter,
        convergence_hook=ConvergenceHook.from_fmax(fmax, frequency=1), **fire_options,
    )
    return _run(stage, structures, model, dtype, device, max_atoms, max_batch_size, progress, fmax=fmax)


def _run(
    stage: BaseDynamics,
    structures: Sequence[ase.Atoms],
    model: Any,
    dtype: torch.dtype | None,
    device: str | torch.device | None,
    max_atoms: int | None,
    max_batch_size: int | None,
    progress: bool,
    fmax: float | None = None,
) -> list[ase.Atoms]:
    """Run ``stage`` over ``structures`` through a sampler into host memory; the results as Atoms."""
    from alchemi_core.data import AtomicData
    from alchemi_core.data.datapipes import ListDataset
    from alchemi_core.dynamics import HostMemory, SizeAwareSampler

    structures = list(structures)
    if not structures:
        raise ConfigurationError("no structures given; pass a list of ase.Atoms")
    refused = {i: why for i, a in enumerate(structures) if (why := _cannot_evaluate(a, model))}
    out: list[ase.Atoms] = []
    for i, atoms in enumerate(structures):
        copy = atoms.copy()
        if i in refused:
            copy.info.update(system_id=i, quarantine=refused[i])
        out.append(copy)
    todo = [_counted(AtomicData.from_atoms(a, dtype=dtype).with_system_id(i), fmax is not None)
            for i, a in enumerate(structures) if i not in refused]
    if not todo:
        return out
    sink = HostMemory(capacity=None)
    stage.sampler = SizeAwareSampler(ListDataset(todo, device=_device_of(model, device)), max_atoms=max_atoms,
                                     max_batch_size=max_batch_size, bin_width=1)
    stage.sinks = [sink]
    if fmax is not None:
        stage.hooks.append(_CountSteps())
    if progress:
        from alchemi_core import registry

        stage.hooks.append(registry.build("hook:progress", frequency=10, structures=len(todo)))
    stage.run()
    done = sink.read()
    for i, atoms in zip(done.system_id.view(-1).tolist(), _results(stage, done, fmax), strict=True):
        out[i] = atoms
    return out


def _results(stage: BaseDynamics, batch: Batch, fmax: float | None) -> list[ase.Atoms]:
    """One ``Atoms`` per system of ``batch`` (a run's output), with the flags of the module docstring."""
    from alchemi_core.dynamics.quarantine import failure_reasons

    status = batch.status.view(-1).tolist()
    key = stage.convergence_hook.criteria[0].key if stage.convergence_hook is not None else None
    force = getattr(batch, key).view(-1).tolist() if key is not None and key in batch else None
    atoms_list = batch.to_atoms()
    for j, atoms in enumerate(atoms_list):
        if status[j] < 0:
            atoms.calc = None  # the results of a structure that went bad are not results
            atoms.info["quarantine"] = "; ".join(failure_reasons(status[j]))
        if fmax is not None and force is not None:
            atoms.info["fmax"] = force[j]
            atoms.info["converged"] = status[j] >= 0 and force[j] <= fmax
    return atoms_list


class _CountSteps(Hook):
    """Counts each system's steps in its stage into the system field ``steps`` (the engine's own
    count restarts when a system leaves the stage, before the sink sees it)."""

    stage = DynamicsStage.AFTER_STEP

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        mask = dynamics.context.system_mask
        if mask is None:
            batch.steps.add_(1)
        else:
            batch.steps.add_(mask)


def _counted(data: AtomicData, count: bool) -> AtomicData:
    """``data`` with a ``steps`` field (0) for :class:`_CountSteps` when ``count``."""
    if count:
        data.steps = torch.zeros((), dtype=torch.long)  # 0-d: a system field
    return data


def _cannot_evaluate(atoms: ase.Atoms, model: Any) -> str | None:
    """Why ``model`` cannot evaluate ``atoms`` (an unknown element, atoms on top of each other), or None."""
    import numpy as np
    from ase.neighborlist import neighbor_list

    from alchemi_core.data.elements import LAST_ELEMENT
    from alchemi_core.models.base import model_card

    if not np.isfinite(atoms.positions).all():
        return "positions are not finite"
    numbers = set(atoms.numbers.tolist())
    species = model_card(model).species
    unknown = sorted(z for z in numbers if not 1 <= z <= LAST_ELEMENT or (species is not None and z not in species))
    if unknown:
        return f"atomic numbers {unknown} unknown to model {model_card(model).name!r}"
    if len(atoms) > 1 and len(neighbor_list("i", atoms, OVERLAP_DISTANCE, self_interaction=False)):
        return f"atoms closer than {OVERLAP_DISTANCE} Å (on top of each other)"
    return None


def _device_of(model: Any, device: str | torch.device | None) -> torch.device:
    """``device``, else where ``model`` keeps its parameters or buffers, else ``cuda`` when there
    is a GPU (a model without tensors, such as the Warp pair potentials, runs where its batch is)."""
    from alchemi_core.workflow.plan import resolve_device

    if device is None and isinstance(model, torch.nn.Module):
        for t in (*model.parameters(), *model.buffers()):
            return t.device
    return resolve_device(device)
