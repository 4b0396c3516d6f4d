"""Per-system quantities hooks report: kinetic energy, temperature, largest force.

Units are alchemi's: velocities in Å/fs, masses in amu, energies in eV, forces in eV/Å, K.

Temperature is ``T = 2 KE / (f kB)`` with ``f`` the Cartesian components that move, as ASE
counts them under ``FixAtoms`` (field ``frozen``) and ``FixCartesian`` (``frozen_axes``), less
three with ``com_fixed=True`` for a stage that keeps the centre of mass at rest
(:func:`com_fixed`) and in systems with the field ``fix_com`` (ASE's ``FixCom``). A system with no moving atom reports 0 K.

Example:
    >>> import torch
    >>> from alchemi_core.testing import make_batch
    >>> from alchemi_hooks.observables import kinetic_energy, temperature
    >>> batch = make_batch([2])
    >>> batch.atomic_masses = torch.tensor([1.0, 1.0])
    >>> batch.velocities = torch.tensor([[0.1, 0.0, 0.0], [0.0, 0.0, 0.0]])
    >>> round(float(kinetic_energy(batch)[0]), 4)    # 0.5 * 1 amu * (0.1 Å/fs)^2 in eV
    0.5182
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from alchemi_core.dynamics.constraints import com_at_rest, free_components
from alchemi_core.units import AMU_A2_PER_FS2_TO_EV, KB

if TYPE_CHECKING:
    from alchemi_core.data import Batch


def per_system_sum(values: torch.Tensor, batch: Batch) -> torch.Tensor:
    """``[B]`` sums of the per-atom ``values`` ``[V]`` over each system's atoms."""
    out = torch.zeros(batch.num_graphs, dtype=values.dtype, device=values.device)
    return out.index_add_(0, batch.batch_idx, values)


def kinetic_energy(batch: Batch) -> torch.Tensor:
    """``[B]`` kinetic energy per system in eV, from ``velocities`` and ``atomic_masses``."""
    v = batch.velocities
    twice_ke = (v * v).sum(dim=-1).mul_(batch.atomic_masses)
    return per_system_sum(twice_ke, batch).mul_(0.5 * AMU_A2_PER_FS2_TO_EV)


def degrees_of_freedom(batch: Batch, com_fixed: bool = False) -> torch.Tensor:
    """``[B]`` the Cartesian components that move, less three in systems whose centre of mass is
    at rest (``com_fixed``, or the system's ``fix_com`` field) when nothing is held (held atoms
    already pin the centre of mass)."""
    free = free_components(batch, batch.positions.dtype)
    dof = per_system_sum(free, batch)
    pinned = per_system_sum(3.0 - free, batch) > 0
    return torch.where(com_at_rest(batch, com_fixed) & ~pinned, dof - 3.0, dof)


def com_fixed(dynamics: object) -> bool:
    """Whether ``dynamics`` keeps each system's centre of mass at rest (its ``fix_com``, else its
    ``conserves_momentum`` attribute; False when it says neither)."""
    value = getattr(dynamics, "fix_com", None)
    if value is None:
        value = getattr(dynamics, "conserves_momentum", False)
    return bool(value)


def temperature(batch: Batch, kinetic: torch.Tensor | None = None, com_fixed: bool = False) -> torch.Tensor:
    """``[B]`` instantaneous temperature in K (degrees of freedom: see the module docstring).

    Args:
        kinetic: The systems' kinetic energies, if already computed.
        com_fixed: The centre of mass is held at rest: ``3N - 3`` degrees of freedom.
    """
    ke = kinetic_energy(batch) if kinetic is None else kinetic
    dof = degrees_of_freedom(batch, com_fixed).clamp_(min=1.0)
    return (2.0 / KB) * ke / dof


def max_force(batch: Batch) -> torch.Tensor:
    """``[B]`` largest atomic force norm per system in eV/Å (0 for a system without atoms)."""
    norms = torch.linalg.vector_norm(batch.forces, dim=-1)
    out = torch.zeros(batch.num_graphs, dtype=norms.dtype, device=norms.device)
    return out.scatter_reduce_(0, batch.batch_idx, norms, reduce="amax", include_self=False)
