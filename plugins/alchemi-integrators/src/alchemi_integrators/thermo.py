"""Per-system kinetic energy, temperature and Maxwell-Boltzmann velocities.

Units are alchemi's: velocities in Å/fs, masses in amu, energies in eV, temperatures in K.

**Degrees of freedom.** A system of N atoms whose centre-of-mass (COM) motion has been removed,
and stays removed, has ``3N - 3`` degrees of freedom: :func:`initialize_velocities` removes COM
motion by default, and velocity Verlet, Nose-Hoover and Langevin with ``fix_com=True`` keep it
at zero (the forces of a translation-invariant model sum to zero). Then the equipartition
temperature is ``2 KE / ((3N - 3) kB)``, which :func:`temperature` returns by default
(``com_fixed=True``). Held atoms and components (``frozen``, ``frozen_axes``) do not count, and
pin the centre of mass (no 3 taken off), as ASE counts them. A system whose COM is free to move (Langevin with ``fix_com=False``, whose
random forces do not sum to zero) thermalises all ``3N`` degrees of freedom: ask for
``temperature(batch, com_fixed=False)``. (ASE's ``Atoms.get_temperature`` always divides by 3N;
for 32 atoms the two differ by 3 %.) A single atom with its COM fixed has no kinetic degree of
freedom; it reports 0 K rather than dividing by zero.

Example:
    >>> import torch
    >>> from alchemi_core.data import AtomicData, Batch
    >>> from alchemi_integrators.thermo import initialize_velocities, temperature
    >>> atoms = AtomicData(atomic_numbers=torch.full((64,), 18), positions=torch.rand(64, 3) * 10)
    >>> batch = Batch.from_data_list([atoms, atoms])
    >>> v = initialize_velocities(batch, 300.0, seed=1)
    >>> temperature(batch).shape
    torch.Size([2])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from alchemi_core.dynamics.constraints import com_at_rest, free_components, has_constraints
from alchemi_core.errors import InvalidDataError
from alchemi_core.units import ACCELERATION, AMU_A2_PER_FS2_TO_EV, KB

if TYPE_CHECKING:
    from alchemi_core.data import Batch

__all__ = [
    "atomic_masses",
    "center_of_mass_velocity",
    "degrees_of_freedom",
    "draw_velocities",
    "initialize_velocities",
    "kinetic_energy",
    "remove_com_velocity",
    "temperature",
]


def atomic_masses(batch: Batch) -> torch.Tensor:
    """``[V]`` masses in amu: the batch's ``atomic_masses``, else standard atomic weights."""
    if "atomic_masses" in batch:
        return batch.atomic_masses
    from alchemi_core.data.elements import masses_for

    return masses_for(batch.atomic_numbers, batch.positions.dtype)


def _per_system_sum(batch: Batch, values: torch.Tensor) -> torch.Tensor:
    """Sum ``[V, ...]`` atom values into ``[B, ...]`` per system on the device."""
    out = values.new_zeros((batch.num_graphs, *values.shape[1:]))
    return out.index_add_(0, batch.batch_idx, values)


def _velocities(batch: Batch) -> torch.Tensor:
    if "velocities" not in batch:
        raise InvalidDataError(
            "the batch has no velocities; call initialize_velocities(batch, temperature) or set "
            "batch.velocities (Å/fs)"
        )
    return batch.velocities


def kinetic_energy(batch: Batch) -> torch.Tensor:
    """``[B]`` kinetic energy of each system in eV, ``sum_i m_i v_i^2 / 2``.

    Example:
        >>> kinetic_energy(batch)  # doctest: +SKIP
        tensor([0.2481, 0.2436])
    """
    v = _velocities(batch)
    mv2 = (v * v).sum(dim=-1) * atomic_masses(batch).to(v.dtype)
    return _per_system_sum(batch, mv2) * (0.5 * AMU_A2_PER_FS2_TO_EV)


def degrees_of_freedom(batch: Batch, com_fixed: bool = True) -> torch.Tensor:
    """``[B]`` kinetic degrees of freedom: ``3N - 3`` with the COM fixed (by the stage, or the
    system's ``fix_com`` field), else ``3N``; where
    atoms or components are held (``frozen``, ``frozen_axes``), the components that move, with
    no 3 taken off (held atoms pin the centre of mass), as ASE counts them under ``FixAtoms``
    and ``FixCartesian``: a thermostat then heats only what moves to its temperature.

    Never below 1, so a lone atom with its COM fixed reports zero temperature, not NaN.
    """
    dtype = batch.positions.dtype
    n = batch.node_counts.to(dtype)
    at_rest = com_at_rest(batch, com_fixed)
    if not has_constraints(batch):
        return (3.0 * n - 3.0 * at_rest.to(dtype)).clamp_(min=1.0)
    free = _per_system_sum(batch, free_components(batch, dtype))
    free = torch.where(at_rest & (free >= 3.0 * n), free - 3.0, free)
    return free.clamp_(min=1.0)


def temperature(batch: Batch, com_fixed: bool = True) -> torch.Tensor:
    """``[B]`` instantaneous temperature of each system in K, ``2 KE / (dof kB)``.

    Args:
        batch: Systems with ``velocities``.
        com_fixed: Count ``3N - 3`` degrees of freedom (COM motion removed and conserved) or
            ``3N`` (see the module docstring for which integrator gives which).
    """
    return 2.0 * kinetic_energy(batch) / (degrees_of_freedom(batch, com_fixed) * KB)


def center_of_mass_velocity(batch: Batch, velocities: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, 3]`` mass-weighted mean velocity of each system (Å/fs)."""
    v = _velocities(batch) if velocities is None else velocities
    m = atomic_masses(batch).to(v.dtype)
    momentum = _per_system_sum(batch, v * m.unsqueeze(-1))
    total = _per_system_sum(batch, m).clamp_(min=torch.finfo(v.dtype).tiny)
    return momentum / total.unsqueeze(-1)


def remove_com_velocity(batch: Batch, velocities: torch.Tensor | None = None) -> torch.Tensor:
    """Subtract each system's COM velocity from its atoms, in place; returns the velocities."""
    v = _velocities(batch) if velocities is None else velocities
    v.sub_(center_of_mass_velocity(batch, v).index_select(0, batch.batch_idx))
    return v


def _temperature_values(batch: Batch, temperature: float | torch.Tensor | str, dtype: torch.dtype) -> torch.Tensor:
    """``[B]`` target temperatures from a number, a tensor or a system field name (checked)."""
    from alchemi_integrators.parameters import SystemParameter

    param = SystemParameter("temperature", temperature, unit="K", low=0.0)
    if param.scalar is not None:
        return torch.full((batch.num_graphs,), param.scalar, dtype=dtype, device=batch.device)
    if param.tensor is not None:
        if param.tensor.numel() != batch.num_graphs:
            raise InvalidDataError(
                f"temperature has {param.tensor.numel()} values for a batch of {batch.num_graphs} systems; "
                "give one per system"
            )
        return param.tensor.to(device=batch.device, dtype=dtype)
    param.bind(batch, "", tensor_allowed=False)
    return param.per_system(batch, dtype)


def initialize_velocities(
    batch: Batch,
    temperature: float | torch.Tensor | str,
    seed: int | None = None,
    remove_com: bool = True,
    *,
    generator: torch.Generator | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Draw Maxwell-Boltzmann velocities at ``temperature`` and store them in ``batch.velocities``.

    Each Cartesian component of atom i is normal with variance ``kB T / m_i``. With
    ``remove_com`` each system's COM velocity is then subtracted, which leaves ``3N - 3``
    thermal degrees of freedom: the expected ``temperature(batch)`` is ``T`` (see the module
    docstring). The velocities are not rescaled to hit ``T`` exactly: a small system's
    instantaneous temperature fluctuates as in the canonical ensemble.

    Args:
        batch: The systems; ``atomic_masses`` are used when present, else standard weights.
        temperature: K, as a number, ``[B]`` tensor, or the name of a system-level field.
        seed: Seeds a fresh generator, so the same seed gives the same velocities.
        remove_com: Subtract each system's COM velocity.
        generator: Draw from this generator instead (continues its stream; ``seed`` ignored).
        mask: ``[B]`` bool; only these systems get new velocities, the others keep theirs. Used
            for systems entering a stage; nothing is read back from the device.

    Returns:
        The ``[V, 3]`` velocities field (Å/fs).

    Example:
        >>> v = initialize_velocities(batch, 50.0, seed=0)  # doctest: +SKIP
    """
    pos = batch.positions
    if generator is None and seed is not None:
        generator = torch.Generator(device=pos.device).manual_seed(int(seed))
    t_sys = _temperature_values(batch, temperature, pos.dtype)
    return draw_velocities(batch, t_sys, generator=generator, remove_com=remove_com, mask=mask)


def draw_velocities(
    batch: Batch,
    temperatures: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
    remove_com: bool = True,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`initialize_velocities` for ``[B]`` temperatures already on the device.

    Reads nothing back from the device, so integrators call it for systems entering a stage.
    """
    pos = batch.positions
    dtype = pos.dtype
    m = atomic_masses(batch).to(dtype)
    # sigma_i^2 = kB T / m_i in (Å/fs)^2: kB T [eV] / m [amu] times ACCELERATION.
    t_atom = temperatures.to(dtype).index_select(0, batch.batch_idx)
    sigma = torch.sqrt(t_atom * (KB * ACCELERATION) / m).unsqueeze(-1)
    new = torch.randn(pos.shape, generator=generator, dtype=dtype, device=pos.device).mul_(sigma)
    if remove_com:
        remove_com_velocity(batch, new)
    if "velocities" not in batch:
        batch.set_field("velocities", torch.zeros_like(pos), "node")
    v = batch.velocities
    if mask is None:
        v.copy_(new)
    else:
        keep = ~mask.index_select(0, batch.batch_idx).unsqueeze(-1)
        v.copy_(torch.where(keep, v, new))
    return v


def masses_and_totals(batch: Batch, inv_mass: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[V, 1]`` masses (amu) and ``[B, 1]`` total mass per system."""
    mass = ACCELERATION / inv_mass
    total = torch.zeros(batch.num_graphs, 1, dtype=mass.dtype, device=mass.device).index_add_(0, batch.batch_idx, mass)
    return mass, total
