"""Instantaneous pressure of periodic systems, the one formula the barostats and the log share.

The pressure tensor is ``P = (sum_i m_i v_i v_i^T) / V - sigma`` with ``sigma`` the model's
``stress`` (ASE's sign: positive under tension, ``sigma = (1/V) dE/d(strain)``), and the scalar
pressure its trace over three, ``2 K / (3 V) - tr(sigma) / 3``. Units are alchemi's: eV/Å³
(``value / units.GPA`` in GPa), Å³, amu and Å/fs.

Example:
    >>> import torch
    >>> from alchemi_core.testing import make_batch
    >>> from alchemi_core.dynamics.pressure import cell_volume
    >>> batch = make_batch([2])
    >>> batch.cell = 3.0 * torch.eye(3).unsqueeze(0)
    >>> float(cell_volume(batch)[0])
    27.0
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from alchemi_core.units import AMU_A2_PER_FS2_TO_EV

if TYPE_CHECKING:
    from alchemi_core.data import Batch

__all__ = ["cell_volume", "kinetic_tensor", "pressure", "pressure_tensor"]


def cell_volume(batch: Batch) -> torch.Tensor:
    """``[B]`` ``|det(cell)|`` in Å³ by the triple product (no solver, no host synchronisation)."""
    cell = batch.cell.to(batch.positions.dtype)
    return torch.linalg.vecdot(cell[:, 0], torch.linalg.cross(cell[:, 1], cell[:, 2])).abs()


def kinetic_tensor(batch: Batch) -> torch.Tensor:
    """``[B, 3, 3]`` ``sum_i m_i v_i v_i^T`` in eV (twice the kinetic energy tensor)."""
    v = batch.velocities
    mv = v * (batch.atomic_masses * AMU_A2_PER_FS2_TO_EV).unsqueeze(-1).to(v.dtype)
    outer = mv.unsqueeze(-1) * v.unsqueeze(-2)
    return torch.zeros(batch.num_graphs, 3, 3, dtype=v.dtype, device=v.device).index_add_(0, batch.batch_idx, outer)


def pressure_tensor(batch: Batch) -> torch.Tensor:
    """``[B, 3, 3]`` instantaneous pressure tensor ``(sum m v v^T) / V - stress`` in eV/Å³."""
    stress = batch.stress.to(batch.positions.dtype)
    return kinetic_tensor(batch) / cell_volume(batch).view(-1, 1, 1) - stress


def pressure(batch: Batch) -> torch.Tensor:
    """``[B]`` instantaneous pressure ``2 K / (3 V) - tr(stress) / 3`` in eV/Å³."""
    return pressure_tensor(batch).diagonal(dim1=-2, dim2=-1).mean(-1)
