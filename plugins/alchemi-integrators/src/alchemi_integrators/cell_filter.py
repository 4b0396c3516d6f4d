"""Cell filters: relax the cell together with the atoms (``FIRE(cell_filter="frechet" | "unit")``).

A cell filter gives an optimiser three extra "atoms" per system, the cell's degrees of freedom,
with forces from the stress, exactly as ASE's ``FrechetCellFilter`` and ``UnitCellFilter`` do.
With ``F`` the deformation gradient of the current cell from the cell the system entered with
(``cell = cell_0 F^T``, ASE's row convention) and ``N`` the system's atom count:

* the atoms' degrees of freedom are their positions in the undeformed cell, ``x F^-T``, and their
  forces ``f F``;
* the virial is ``W = -V (sigma + p I)`` (``sigma`` the stress, positive under tension, ``p`` the
  ``scalar_pressure`` in eV/Å³); ``hydrostatic_strain`` keeps only its trace, ``mask`` (six Voigt
  flags xx, yy, zz, yz, xz, xy, or a 3x3) zeroes fixed strain components;
* ``"unit"``: the cell's degrees of freedom are ``N F`` and their forces ``W F^-T / N``;
* ``"frechet"``: the cell's degrees of freedom are ``N log F`` and their forces the gradient of
  the enthalpy with respect to ``log F`` (the Fréchet derivative of the matrix exponential applied
  to ``W F^-T``), divided by ``N``;
* ``constant_volume`` removes the trace of the cell forces (to first order the volume stays).

Both reach the same minimum, where the atoms' forces vanish and the stress equals ``-p``; the
log parametrisation takes larger cell steps safely and converges in fewer steps. An optimiser's
``fmax`` criterion counts every row of these forces, the atoms' and the cell's, as ASE's
optimisers do through a filter: :data:`CELL_FILTER_FMAX` holds that per system.

The filter keeps its state in system-level batch fields that travel with each system: the
reference cell (:data:`CELL_REFERENCE`), the cell's degrees of freedom (:data:`CELL_DOF`) and
their velocities (:data:`CELL_VELOCITY`).

Example:
    >>> f = CellFilter("frechet", hydrostatic_strain=True)
    >>> f.kind, f.mask is None
    ('frechet', True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch

from alchemi_core.dynamics.convergence import ConvergenceHook
from alchemi_core.errors import ConfigurationError
from alchemi_integrators.cell_math import det3, expm, expm_frechet_adjoint, inv3, logm_near_identity

if TYPE_CHECKING:
    from alchemi_core.data import Batch
    from alchemi_integrators.base import Integrator
    from alchemi_integrators.parameters import ParameterValue

CELL_FILTERS = ("frechet", "unit")

#: Per-system filter state (system-level batch fields, reset when a system enters the stage).
CELL_REFERENCE = "cell_filter_reference"
CELL_DOF = "cell_filter_dof"
CELL_VELOCITY = "cell_filter_velocity"
#: Largest force norm per system over the atoms' and the cell's rows (eV/Å), ASE's fmax.
CELL_FILTER_FMAX = "cell_filter_fmax"

_VOIGT = ((0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1))


def strain_mask(mask: Sequence[bool] | torch.Tensor | None) -> torch.Tensor | None:
    """A ``[3, 3]`` float mask from six Voigt flags (xx, yy, zz, yz, xz, xy) or a 3x3; None: all free.

    Example:
        >>> strain_mask([True, True, True, False, False, False]).tolist()
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    """
    if mask is None:
        return None
    m = torch.as_tensor(mask, dtype=torch.float64)
    if m.shape == (6,):
        full = torch.zeros(3, 3, dtype=torch.float64)
        for (i, j), v in zip(_VOIGT, m, strict=True):
            full[i, j] = full[j, i] = v
        m = full
    if m.shape != (3, 3):
        raise ConfigurationError(f"a cell filter's mask takes 6 Voigt flags or a 3x3, got shape {tuple(m.shape)}")
    return None if bool((m != 0).all()) else (m != 0).to(torch.float64)


class CellFilter:
    """ASE's ``FrechetCellFilter`` (``"frechet"``) or ``UnitCellFilter`` (``"unit"``), batched.

    Args:
        kind: ``"frechet"`` or ``"unit"``.
        hydrostatic_strain: Only hydrostatic deformation (the virial's trace).
        constant_volume: Project out the trace of the cell forces.
        mask: Six Voigt flags or a 3x3 of the strain components to relax (None: all).
        cell_factor: Scale of the cell's degrees of freedom (None: the system's atom count).

    The scalar pressure is the optimiser's parameter ``scalar_pressure`` (per system).
    """

    def __init__(
        self,
        kind: str,
        *,
        hydrostatic_strain: bool = False,
        constant_volume: bool = False,
        mask: Sequence[bool] | torch.Tensor | None = None,
        cell_factor: float | None = None,
    ) -> None:
        if kind not in CELL_FILTERS:
            raise ConfigurationError(f"cell_filter must be one of {CELL_FILTERS} or None, got {kind!r}")
        if cell_factor is not None and not float(cell_factor) > 0:
            raise ConfigurationError(f"cell_factor must be > 0, got {cell_factor}")
        self.kind = kind
        self.hydrostatic_strain = bool(hydrostatic_strain)
        self.constant_volume = bool(constant_volume)
        self.mask = strain_mask(mask)
        self.cell_factor = None if cell_factor is None else float(cell_factor)
        self._mask_on: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}

    def __repr__(self) -> str:
        return (f"CellFilter({self.kind!r}, hydrostatic_strain={self.hydrostatic_strain}, "
                f"constant_volume={self.constant_volume}, mask={None if self.mask is None else self.mask.tolist()})")

    # ------------------------------------------------------------------ state
    def factor(self, batch: Batch) -> torch.Tensor:
        """``[B, 1, 1]`` scale of the cell's degrees of freedom (ASE: the atom count)."""
        if self.cell_factor is not None:
            return torch.full((batch.num_graphs, 1, 1), self.cell_factor, dtype=batch.positions.dtype,
                              device=batch.device)
        return batch.node_counts.to(batch.positions.dtype).view(-1, 1, 1)

    def reset(self, batch: Batch, entering: torch.Tensor) -> None:
        """Entering systems take their current cell as the reference, at rest."""
        rows = entering.view(-1, 1, 1)
        ref = getattr(batch, CELL_REFERENCE)
        ref.copy_(torch.where(rows, batch.cell.to(ref.dtype), ref))
        dof = getattr(batch, CELL_DOF)
        start = torch.zeros_like(dof) if self.kind == "frechet" else torch.eye(3, dtype=dof.dtype, device=dof.device)
        if self.kind == "unit":
            start = start * self.factor(batch)
        dof.copy_(torch.where(rows, start, dof))
        getattr(batch, CELL_VELOCITY).masked_fill_(rows, 0.0)

    def _mask(self, like: torch.Tensor) -> torch.Tensor | None:
        if self.mask is None:
            return None
        key = (like.dtype, like.device)
        m = self._mask_on.get(key)
        if m is None:
            m = self._mask_on[key] = self.mask.to(dtype=like.dtype, device=like.device)
        return m

    # ------------------------------------------------------------------ geometry
    def deformation(self, batch: Batch) -> torch.Tensor:
        """``[B, 3, 3]`` deformation gradient ``F`` of the current cell (``cell = cell_0 F^T``)."""
        ref = getattr(batch, CELL_REFERENCE)
        ref_inv = inv3(ref)
        return (ref_inv @ batch.cell.to(ref.dtype)).transpose(-1, -2)

    def deformation_of_dof(self, batch: Batch, dof: torch.Tensor) -> torch.Tensor:
        """``F`` from the cell's degrees of freedom, with fixed strain components held at 0."""
        f = dof / self.factor(batch)
        if self.kind == "frechet":
            f = expm(f)
        mask = self._mask(f)
        if mask is not None:
            eye = torch.eye(3, dtype=f.dtype, device=f.device)
            f = eye + (f - eye) * mask
        return f

    def dof_of_deformation(self, batch: Batch, f: torch.Tensor) -> torch.Tensor:
        """The cell's degrees of freedom of a deformation gradient (inverse of the above)."""
        x = logm_near_identity(f) if self.kind == "frechet" else f
        return x * self.factor(batch)

    # ------------------------------------------------------------------ forces
    def forces(
        self, batch: Batch, pressure: torch.Tensor, atom_out: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Atom forces in the undeformed frame (into ``atom_out`` ``[V, 3]``) and ``[B, 3, 3]``
        cell forces, from ``batch.forces``, ``batch.stress`` and ``pressure`` ``[B]`` (eV/Å³)."""
        f = self.deformation(batch)
        per_atom = f.index_select(0, batch.batch_idx)
        torch.bmm(batch.forces.unsqueeze(1), per_atom, out=atom_out.unsqueeze(1))
        cell = batch.cell.to(f.dtype)
        volume = det3(cell).abs().view(-1, 1, 1)
        eye = torch.eye(3, dtype=f.dtype, device=f.device)
        virial = -volume * (batch.stress.to(f.dtype) + pressure.view(-1, 1, 1) * eye)
        f_inv_t = inv3(f).transpose(-1, -2)
        mask = self._mask(f)
        if self.kind == "unit":
            virial = virial @ f_inv_t
            virial = self._hydrostatic(virial)
            if mask is not None:
                virial = virial * mask
            if self.constant_volume:
                virial = virial - _trace(virial) / 3.0 * eye
            cell_forces = virial
        else:
            virial = self._hydrostatic(virial)
            if mask is not None:
                virial = virial * mask
            log_f = getattr(batch, CELL_DOF) / self.factor(batch)
            cell_forces = expm_frechet_adjoint(log_f, virial @ f_inv_t)
            if self.constant_volume:
                cell_forces = cell_forces - _trace(cell_forces) / 3.0 * eye
        return atom_out, cell_forces / self.factor(batch)

    def _hydrostatic(self, virial: torch.Tensor) -> torch.Tensor:
        if not self.hydrostatic_strain:
            return virial
        eye = torch.eye(3, dtype=virial.dtype, device=virial.device)
        return _trace(virial) / 3.0 * eye

    @staticmethod
    def fmax(batch: Batch, atom_forces: torch.Tensor, cell_forces: torch.Tensor, out: torch.Tensor) -> None:
        """Write into ``out`` ``[B]`` the largest row norm of the atoms' and the cell's forces."""
        atom_norms = torch.linalg.vector_norm(atom_forces, dim=-1)
        out.zero_().scatter_reduce_(0, batch.batch_idx, atom_norms.to(out.dtype), reduce="amax", include_self=False)
        torch.maximum(out, torch.linalg.vector_norm(cell_forces, dim=-1).amax(-1).to(out.dtype), out=out)

    # ------------------------------------------------------------------ moving
    def move(
        self, batch: Batch, dx: torch.Tensor, dof_step: torch.Tensor, active: torch.Tensor | None
    ) -> None:
        """Move atoms by ``dx`` (undeformed frame) and the cell's degrees of freedom by
        ``dof_step``; systems where ``active`` is False keep their cell and positions."""
        f_old = self.deformation(batch)
        dof = getattr(batch, CELL_DOF)
        new_dof = dof + dof_step
        f_new = self.deformation_of_dof(batch, new_dof)
        if self.mask is not None:
            new_dof = self.dof_of_deformation(batch, f_new)
        # x' = (x F_old^-T + dx) F_new^T = x (F_old^-T F_new^T) + dx F_new^T
        f_new_t = f_new.transpose(-1, -2)
        carry = inv3(f_old).transpose(-1, -2) @ f_new_t
        ref = getattr(batch, CELL_REFERENCE)
        new_cell = ref @ f_new_t
        if active is not None:
            rows = active.view(-1, 1, 1)
            eye = torch.eye(3, dtype=carry.dtype, device=carry.device)
            carry = torch.where(rows, carry, eye)
            f_new_t = torch.where(rows, f_new_t, eye)
            new_cell = torch.where(rows, new_cell, batch.cell.to(new_cell.dtype))
            new_dof = torch.where(rows, new_dof, dof)
        x = batch.positions
        idx = batch.batch_idx
        moved = torch.bmm(x.unsqueeze(1), carry.index_select(0, idx)).squeeze(1)
        moved.unsqueeze(1).baddbmm_(dx.unsqueeze(1), f_new_t.index_select(0, idx))
        x.copy_(moved)
        batch.cell.copy_(new_cell.to(batch.cell.dtype))
        dof.copy_(new_dof)


def attach_cell_filter(
    dyn: Integrator,
    kind: str | None,
    scalar_pressure: ParameterValue | None,
    **options: Any,
) -> CellFilter | None:
    """The cell filter an optimiser's arguments ask for (None: the cell stays), with what it
    implies for ``dyn``: the ``scalar_pressure`` parameter, the model's stress, cells that move and
    an ``fmax`` criterion that counts the cell's forces (:func:`count_cell_forces`).

    Args:
        dyn: The optimiser (FIRE, L-BFGS, BFGS).
        kind: ``"frechet"``, ``"unit"`` or None.
        scalar_pressure: Target pressure in eV/Å³ (number, ``[B]`` tensor or field name).
        **options: :class:`CellFilter`'s options; False and None mean "not given".

    Raises:
        ConfigurationError: A filter option without a filter, or an unknown filter.
    """
    given = {k: v for k, v in options.items() if v is not None and v is not False}
    if kind is None:
        if given or scalar_pressure is not None:
            raise ConfigurationError(
                f"{sorted(given) or ['scalar_pressure']} only apply with a cell filter: "
                "pass cell_filter='frechet' or 'unit'"
            )
        return None
    cell_filter = CellFilter(kind, **given)
    dyn.declare("scalar_pressure", 0.0 if scalar_pressure is None else scalar_pressure, unit="eV/Å³")
    dyn.needs_stress = dyn.moves_cell = True
    if dyn.convergence_hook is not None:
        dyn.convergence_hook = count_cell_forces(dyn.convergence_hook)
    return cell_filter


def count_cell_forces(hook: ConvergenceHook) -> ConvergenceHook:
    """A copy of ``hook`` whose ``fmax`` criteria read the cell filter's fmax (atoms and cell)."""
    criteria = [attrs.evolve(c, key=CELL_FILTER_FMAX) if c.key == "fmax" else c for c in hook.criteria]
    if all(c.key != CELL_FILTER_FMAX for c in criteria):
        return hook
    return ConvergenceHook(
        criteria=criteria, source_status=hook.source_status, target_status=hook.target_status,
        frequency=hook.frequency,
    )


def _trace(m: torch.Tensor) -> torch.Tensor:
    return m.diagonal(dim1=-2, dim2=-1).sum(-1)[..., None, None]
