"""Derived structures (scaled cells, strained cells) of many structures, run through alchemi's
engine in one call and accounted for one by one.

A property gives :func:`run_per_structure` the function that derives the structures of one
structure; each derived structure is tagged with the index of the structure it comes from and its
own index among that structure's (``info["structure"]``, ``info["derived"]``), and all of them go
to :func:`run_derived`: one :func:`alchemi_core.relax` call (FIRE, positions relaxed at
fixed cell) or one :func:`alchemi_core.evaluate` call (``integrator:static``) for all of them, so
the engine batches them inflight whatever structure they come from. Each comes back once, in the
order given, with ``info["failure"]`` set to the reason when it has no usable result (the model
could not evaluate it, or its positions did not relax).

Example:
    >>> from ase.build import bulk
    >>> from alchemi_properties.derived import as_atoms_list
    >>> [a.get_chemical_formula() for a in as_atoms_list([bulk("Cu")])]
    ['Cu']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from alchemi_core.errors import ConfigurationError

if TYPE_CHECKING:
    import ase

    from alchemi_core.data import AtomicData, Batch

#: What ``relax`` adds to ``atoms.info`` (dropped before a structure is evaluated again).
_RUN_KEYS = ("system_id", "status", "converged", "steps", "fmax", "quarantine")


def as_atoms_list(structures: Sequence[ase.Atoms | AtomicData] | Batch) -> list[ase.Atoms]:
    """The structures as ASE ``Atoms``: a list of ``Atoms`` or ``AtomicData``, or a ``Batch``.

    Raises:
        ConfigurationError: Nothing given, or an item that is neither.
    """
    import ase

    from alchemi_core.data import AtomicData, Batch

    if isinstance(structures, Batch):
        out = structures.to_atoms()
    else:
        out = []
        for i, s in enumerate(structures):
            if isinstance(s, AtomicData):
                out.append(s.to_atoms())
            elif isinstance(s, ase.Atoms):
                out.append(s)
            else:
                raise ConfigurationError(f"structure {i} is a {type(s).__name__}; pass ase.Atoms, AtomicData or a Batch")
    if not out:
        raise ConfigurationError("no structures given; pass a list of ase.Atoms, AtomicData or a Batch")
    return out


def periodic_problem(atoms: ase.Atoms) -> str | None:
    """Why ``atoms`` has no cell to scale or strain (not periodic in 3 dimensions), or None."""
    if not atoms.pbc.all():
        return f"needs a cell periodic in 3 dimensions (pbc is {atoms.pbc.tolist()})"
    if abs(atoms.cell.volume) < 1e-9:
        return "needs a cell of non-zero volume"
    return None


def run_per_structure(
    structures: Sequence[ase.Atoms | AtomicData] | Batch,
    make: Callable[[ase.Atoms], list[ase.Atoms]],
    model: Any,
    **options: Any,
) -> list[tuple[ase.Atoms, list[ase.Atoms] | str]]:
    """Derive ``make(atoms)`` from each structure periodic in 3 dimensions and run them all at once.

    Args:
        structures: As :func:`as_atoms_list` takes them.
        make: The derived structures of one structure, in order.
        model: An alchemi model.
        **options: Keywords of :func:`run_derived`.

    Returns:
        For each structure, in input order: ``(atoms, results)``, the results of its derived
        structures in ``make``'s order, or ``(atoms, reason)`` for one that could not be derived.
    """
    atoms_list = as_atoms_list(structures)
    refused = {i: why for i, a in enumerate(atoms_list) if (why := periodic_problem(a))}
    jobs = [_tagged(d, i, k) for i, a in enumerate(atoms_list) if i not in refused for k, d in enumerate(make(a))]
    by_structure: dict[int, list[ase.Atoms]] = {i: [] for i in range(len(atoms_list)) if i not in refused}
    for a in run_derived(jobs, model, **options) if jobs else []:
        by_structure[a.info["structure"]].append(a)
    return [(a, refused[i] if i in refused else by_structure[i]) for i, a in enumerate(atoms_list)]


def _tagged(atoms: ase.Atoms, structure: int, index: int) -> ase.Atoms:
    """``atoms`` (no calculator, no run results) tagged as derived structure ``index`` of ``structure``."""
    atoms.calc = None
    for key in _RUN_KEYS:
        atoms.info.pop(key, None)
    atoms.info.update(structure=structure, derived=index)
    return atoms


def run_derived(
    jobs: Sequence[ase.Atoms],
    model: Any,
    *,
    relax_positions: bool,
    compute_stress: bool,
    fmax: float,
    max_steps: int,
    dtype: torch.dtype | None,
    device: str | torch.device | None,
    max_atoms: int | None,
    max_batch_size: int | None,
    progress: bool,
) -> list[ase.Atoms]:
    """Evaluate, or relax the positions of, every derived structure in ``jobs`` (tagged, see the
    module docstring); with ``compute_stress``, the stress of each relaxed structure comes from one
    more evaluation (FIRE at fixed cell does not ask the model for it)."""
    from alchemi_core import evaluate, relax

    common: dict[str, Any] = dict(dtype=dtype, device=device, max_atoms=max_atoms, max_batch_size=max_batch_size,
                                  progress=progress)
    if not relax_positions:
        return [_checked(a, src) for a, src in zip(evaluate(jobs, model, compute_stress=compute_stress, **common),
                                                  jobs, strict=True)]
    relaxed = [_checked(a, src, fmax, max_steps)
               for a, src in zip(relax(jobs, model, fmax=fmax, max_steps=max_steps, **common), jobs, strict=True)]
    if not compute_stress:
        return relaxed
    ok = [i for i, a in enumerate(relaxed) if "failure" not in a.info]
    if ok:
        again = [_moved(jobs[i], relaxed[i]) for i in ok]
        for i, a in zip(ok, evaluate(again, model, compute_stress=True, **common), strict=True):
            relaxed[i] = _checked(a, jobs[i])
    return relaxed


def _moved(job: ase.Atoms, relaxed: ase.Atoms) -> ase.Atoms:
    """``job`` (with its own info) at the positions of ``relaxed``."""
    out = job.copy()
    out.positions = relaxed.positions
    return out


def _checked(result: ase.Atoms, job: ase.Atoms, fmax: float | None = None, max_steps: int = 0) -> ase.Atoms:
    """``result`` tagged as ``job`` is, with ``info["failure"]`` where it has no usable result."""
    reason = result.info.get("quarantine")
    if reason is None and fmax is not None and not result.info.get("converged", False):
        reason = (f"positions did not relax to fmax {fmax} eV/Å in {max_steps} steps "
                  f"(fmax {result.info.get('fmax', float('nan')):.3g} eV/Å); raise max_steps")
    result.info.update(structure=job.info["structure"], derived=job.info["derived"])
    if reason is not None:
        result.info["failure"] = str(reason)
    return result
