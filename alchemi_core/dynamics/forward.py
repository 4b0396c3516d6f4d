"""The model forward of a step: one evaluation per distinct model, results into the batch.

Also the models' own checks: ``verify`` (reads back: at checks, and after the forward of a run's
start or of a refill only) and ``error_flag`` (a device flag that rides on a check's read-back).
"""

from __future__ import annotations

from typing import Any

import torch

from alchemi_core.data import Batch
from alchemi_core.dynamics.state import RunState
from alchemi_core.errors import InvalidDataError
from alchemi_core.models.base import model_card


def forward(state: RunState, batch: Batch) -> None:
    """One model evaluation per distinct model; results written into the batch buffers.
    Atoms marked ``frozen`` and components ``frozen_axes`` holds feel no force (as under ASE's
    ``FixAtoms`` and ``FixCartesian``), so ``fmax`` counts only what moves; forces and stress of a
    system with ``symprec`` are averaged over its space group (``FixSymmetry``), a system with
    ``fix_com`` feels no net force (``FixCom``); the step puts back whatever an update moved
    against them (``constraints``)."""
    models, stress = state.models, state.needs_stress
    if len(models) == 1:
        model = models[0]
        _store(batch, model(batch, compute_stress=True) if stress else model(batch), model)
        state.constraints.adjust_forces(batch)
        return
    # Several models: each system takes the forces (and stress) of its own stage's model.
    kwargs = {"compute_stress": True} if stress else {}
    _store(batch, models[0](batch, **kwargs), models[0])
    for m in models[1:]:
        out = m(batch, **kwargs)
        _check_shapes(m, out, batch)
        for s in state.subs:
            if s.dynamics.model is m and s.sys_mask is not None:
                nm = s.sys_mask.index_select(0, batch.batch_idx).unsqueeze(-1)
                batch.forces.copy_(torch.where(nm, out["forces"], batch.forces))
                batch.energy.copy_(torch.where(s.sys_mask.unsqueeze(-1), out["energy"], batch.energy))
                if stress and out.get("stress") is not None:
                    rows = s.sys_mask.view(-1, 1, 1)
                    batch.stress.copy_(torch.where(rows, out["stress"], batch.stress))
    state.constraints.adjust_forces(batch)


def verify_models(models: list[Any], batch: Batch) -> None:
    """Each model's ``verify``: errors it recorded on the device (reads back)."""
    for m in models:
        verify = getattr(m, "verify", None)
        if verify is not None:
            verify(batch)


def model_flags(models: list[Any], batch: Batch) -> tuple[torch.Tensor | None, list[Any]]:
    """The models' error flag (a 0-d device tensor, True when some model's ``verify`` may raise;
    None: no model gave one) and the models that gave none but have a ``verify`` (not called)."""
    flags, unflagged = [], []
    for m in models:
        flag_of = getattr(m, "error_flag", None)
        flag = flag_of(batch) if flag_of is not None else None
        if flag is not None:
            flags.append(flag.reshape(()))
        elif getattr(m, "verify", None) is not None:
            unflagged.append(m)
    if not flags:
        return None, unflagged
    return (flags[0] if len(flags) == 1 else torch.stack(flags).any()), unflagged


def _store(batch: Batch, out: Any, model: Any) -> None:
    """Copy ``model``'s results into the batch's fields (host-side shape comparisons only:
    a copy would broadcast a result of another shape silently, or fail in torch)."""
    try:
        energy, forces = out["energy"], out["forces"]
    except (KeyError, TypeError):
        raise InvalidDataError(
            f"model {model_card(model).name!r} must return a mapping with 'energy' [B, 1] and 'forces' [V, 3]"
        ) from None
    f = batch.forces
    if forces is not f:
        if forces.shape != f.shape:
            _check_shapes(model, out, batch)
        f.copy_(forces)
    e = batch.energy
    if energy is not e:
        if energy.numel() != e.numel():
            _check_shapes(model, out, batch)
        e.copy_(energy.reshape(e.shape))
    charges = out.get("charges") if hasattr(out, "get") else None
    if charges is not None and "charges" in batch:  # partial charges a model predicts
        batch.charges.copy_(charges.reshape(batch.charges.shape))
    stress = out.get("stress") if hasattr(out, "get") else None
    if stress is not None:
        if stress.shape != (batch.num_graphs, 3, 3):
            _check_shapes(model, out, batch)
        if "stress" in batch:
            batch.stress.copy_(stress)
        else:
            batch.set_field("stress", stress.detach().clone(), "system")


def _check_shapes(model: Any, out: Any, batch: Any) -> None:
    """Raise when ``model``'s energy, forces or stress has another shape than the batch needs.

    Raises:
        InvalidDataError: Names the model, the result, its shape and the shape expected.
    """
    n, v = batch.num_graphs, batch.num_nodes
    expected = {"energy": ((n, 1), (n,), "one per system"), "forces": ((v, 3), None, "x, y, z per atom"),
                "stress": ((n, 3, 3), None, "a 3 x 3 matrix per system")}
    for name, (shape, flat, what) in expected.items():
        value = out.get(name) if hasattr(out, "get") else None
        got = tuple(getattr(value, "shape", ()))
        if value is not None and got not in (shape, flat):
            raise InvalidDataError(
                f"model {model_card(model).name!r} returned {name} of shape {list(got)} for a batch of {n} "
                f"systems and {v} atoms; a model must return {name} of shape {list(shape)} ({what})"
            )
