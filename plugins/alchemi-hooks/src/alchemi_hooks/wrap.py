"""``WrapPeriodicHook``: put atoms that left the cell back in, along its periodic axes.

Along each periodic axis the hook subtracts ``floor(s)`` lattice vectors from an atom with
fractional coordinates ``s = r C^-1`` (rows of ``cell`` are lattice vectors, as in ASE); other
axes are never touched. Zero-length vectors along non-periodic axes (a slab's missing ``c``) are
completed with perpendicular ones, as ASE does. A wrap does not change ``batch.version``: a
model's neighbour list must notice displacements itself, not key on the version alone.

Example:
    >>> from alchemi_core.dynamics import DemoDynamics
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> from alchemi_hooks.wrap import WrapPeriodicHook
    >>> md = DemoDynamics(model=DemoModelWrapper(), n_steps=100, dt=0.5, hooks=[WrapPeriodicHook(frequency=10)])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from alchemi_core.dynamics.hook import Hook
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_hooks.requirements import require_fields
from alchemi_hooks.scope import Scope

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: Lattice vectors shorter than this (Å) count as absent.
_ABSENT = 1e-10


def _fill_by_cross(cell: torch.Tensor) -> torch.Tensor:
    """Absent rows whose two partners are present become the unit cross product of those."""
    a, b, c = cell.unbind(1)
    cross = torch.stack((torch.linalg.cross(b, c), torch.linalg.cross(c, a), torch.linalg.cross(a, b)), dim=1)
    size = torch.linalg.vector_norm(cross, dim=-1, keepdim=True)
    absent = torch.linalg.vector_norm(cell, dim=-1, keepdim=True) < _ABSENT
    return torch.where(absent & (size > _ABSENT), cross / size.clamp_min(_ABSENT), cell)


def complete_cell(cell: torch.Tensor) -> torch.Tensor:
    """``[B, 3, 3]`` cells with absent lattice vectors replaced by perpendicular unit vectors.

    One absent vector becomes the unit normal of the other two; with only one vector present,
    the first absent one becomes a unit vector perpendicular to it and the last their normal; an
    all-zero cell becomes the identity.
    """
    out = _fill_by_cross(cell)
    present = torch.linalg.vector_norm(out, dim=-1) >= _ABSENT  # [B, 3]
    # At most one vector is present where any is still absent: find one perpendicular to it.
    only = (out * present.unsqueeze(-1)).sum(dim=1)
    unit = only / torch.linalg.vector_norm(only, dim=-1, keepdim=True).clamp_min(_ABSENT)
    eye = torch.eye(3, dtype=cell.dtype, device=cell.device)
    axis = eye.index_select(0, unit.abs().argmin(dim=-1))
    perpendicular = axis - (axis * unit).sum(dim=-1, keepdim=True) * unit
    perpendicular = perpendicular / torch.linalg.vector_norm(perpendicular, dim=-1, keepdim=True)
    absent = ~present
    first_absent = absent & (absent.cumsum(dim=1) == 1)
    out = torch.where(first_absent.unsqueeze(-1), perpendicular.unsqueeze(1), out)
    out = _fill_by_cross(out)
    still = torch.linalg.vector_norm(out, dim=-1, keepdim=True) < _ABSENT
    return torch.where(still, eye.expand_as(out), out)


def reciprocal_rows(cell: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``d_i`` with ``d_i . a_j = delta_ij`` (so fractional ``s_i = d_i . r``), and which cells
    are invertible: cross products over the volume, no batched LU and no host check."""
    a, b, c = cell.unbind(1)
    cross = torch.stack((torch.linalg.cross(b, c), torch.linalg.cross(c, a), torch.linalg.cross(a, b)), dim=1)
    volume = (a * cross[:, 0]).sum(dim=-1)
    invertible = volume.abs() > _ABSENT
    safe = torch.where(invertible, volume, torch.ones_like(volume))
    return cross / safe.view(-1, 1, 1), invertible


class WrapPeriodicHook(Hook):
    """Wrap positions into the cell along periodic axes every ``frequency`` steps.

    Args:
        frequency: Wrap every N-th step.

    Raises:
        ConfigurationError: At run start, a batch without ``cell`` or ``pbc``.
    """

    stage = DynamicsStage.AFTER_STEP

    def __init__(self, frequency: int = 1) -> None:
        super().__init__(frequency=frequency)
        self._scope = Scope()

    def on_run_start(self, batch: Batch, dynamics: Any) -> None:
        require_fields(
            batch, ("cell", "pbc"), "WrapPeriodicHook",
            "Give each structure cell=[3, 3] (rows are lattice vectors, Å) and pbc=[bool, bool, bool].",
        )

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        pos = batch.positions
        idx = batch.batch_idx
        cell = complete_cell(batch.cell.to(pos.dtype))
        dual, invertible = reciprocal_rows(cell)
        frac = torch.bmm(dual.index_select(0, idx), pos.unsqueeze(-1)).squeeze(-1)
        wrap = batch.pbc.to(torch.bool).index_select(0, idx) & invertible.index_select(0, idx).unsqueeze(-1)
        atoms = self._scope.atoms(batch, dynamics)
        if atoms is not None:
            wrap &= atoms.unsqueeze(-1)
        # where, not a product: a singular cell's inf must not leak into atoms left alone.
        shift = torch.where(wrap, torch.floor(frac), torch.zeros_like(frac))
        pos.sub_(torch.bmm(shift.unsqueeze(1), cell.index_select(0, idx)).squeeze(1))

    def __repr__(self) -> str:
        return f"WrapPeriodicHook(frequency={self.frequency})"
