"""Constraints: the one place every step honours them, whatever the integrator.

Fixed atoms and fixed Cartesian components, a kept space group and a fixed centre of mass.

Two atom fields hold atoms in place, as ASE's constraints do:

* ``frozen``: ``[V]`` bool, the whole atom (ASE's ``FixAtoms``);
* ``frozen_axes``: ``[V, 3]`` bool, single Cartesian components (ASE's
  ``FixCartesian(indices, mask=(True, False, True))``: x and z held, y free).

The engine applies them around every stage's update, whatever the integrator and its backend
(torch or Warp): before the stages' ``pre_update`` it keeps
the positions (and, where a stage moves cells, the cells); after them it puts every held
component back and zeroes its velocity; after ``post_update`` it zeroes those velocities again.
The forces on held components are zeroed after each model forward, so ``fmax`` and optimisers
see only what moves. A held coordinate therefore never changes, bit for bit, whatever a stage's
update did to it (thermostat noise, a centre-of-mass correction, FIRE's mixing).

Where a stage moves cells (a cell filter, NPT: ``BaseDynamics.moves_cell``) a held component
follows the cell's deformation of the step, as under ASE's ``FrechetCellFilter``: its position is
the kept one mapped by ``cell_old^-1 cell_new`` (so a ``frozen`` atom keeps its fractional
coordinates), and stays bit for bit where a system's cell did not change.

Two system fields constrain whole systems:

* ``symprec`` (float, above 0): the system keeps its space group (ASE's ``FixSymmetry``): forces
  and stress are averaged over the group after each forward, and each step's cell change and
  position step (taken from the old positions carried by the averaged cell change) before the
  held components are put back (:mod:`alchemi_core.dynamics.symmetry`);
* ``fix_com`` (bool): the system's centre of mass stays put (ASE's ``FixCom``): the forces lose
  ``m_i sum(m f) / sum(m^2)``, each step's positions are shifted back to the centre of mass they
  started from (carried by the cell), the velocities lose the centre-of-mass velocity.

Only batches with such fields pay for it; buffers are allocated when the batch's systems
change, never per step, and nothing is read back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from alchemi_core.data.fields import FIX_COM, FROZEN_AXES
from alchemi_core.dynamics.symmetry import Symmetry
from alchemi_core.errors import InvalidDataError
from alchemi_core.workspace import Workspace

if TYPE_CHECKING:
    from alchemi_core.data import Batch

__all__ = ["FROZEN_AXES", "CentreOfMass", "Constraints", "com_at_rest", "free_components", "has_constraints", "hold_forces"]


def has_constraints(batch: Batch) -> bool:
    """Whether ``batch`` holds some atom or component fixed (has ``frozen`` or ``frozen_axes``)."""
    return "frozen" in batch or FROZEN_AXES in batch


def com_at_rest(batch: Batch, com_fixed: bool) -> torch.Tensor:
    """``[B]`` bool: the systems whose centre of mass stays at rest, all of them when the stage
    keeps it (``com_fixed``), else those with the system field ``fix_com`` (ASE's ``FixCom``).
    Temperatures count three degrees of freedom fewer in these systems."""
    if FIX_COM in batch and not com_fixed:
        return getattr(batch, FIX_COM).reshape(-1).to(torch.bool)
    return torch.full((batch.num_graphs,), com_fixed, dtype=torch.bool, device=batch.device)


def hold_forces(batch: Batch) -> None:
    """Zero the forces on held atoms and components (in place: nothing allocated, no read-back)."""
    if "frozen" in batch:
        frozen = batch.frozen
        mask = frozen if frozen.dtype == torch.bool else frozen.to(torch.bool)
        batch.forces.masked_fill_(mask.view(-1, 1), 0.0)
    if FROZEN_AXES in batch:
        axes = getattr(batch, FROZEN_AXES)
        batch.forces.masked_fill_(axes if axes.dtype == torch.bool else axes.to(torch.bool), 0.0)


def free_components(batch: Batch, dtype: torch.dtype) -> torch.Tensor:
    """``[V]`` how many Cartesian components of each atom move: 3, less those held (0 for a
    ``frozen`` atom), as ASE's ``get_removed_dof`` counts them; a new tensor."""
    free = torch.full((batch.num_nodes,), 3.0, dtype=dtype, device=batch.device)
    if "frozen" in batch:
        free.masked_fill_(batch.frozen.reshape(-1).to(torch.bool), 0.0)
    if FROZEN_AXES in batch:
        free.sub_(getattr(batch, FROZEN_AXES).to(dtype).sum(dim=-1)).clamp_(min=0.0)
    return free


class CentreOfMass:
    """Systems whose centre of mass stays put (system field ``fix_com``, ASE's ``FixCom``): their
    forces lose their mass-weighted mean (ASE's ``adjust_forces``), each step's positions are
    shifted back to the centre of mass they started from, and their velocities lose the
    centre-of-mass velocity. Weights per atom are written with the masks; the step reads nothing."""

    def __init__(self) -> None:
        #: ``[V, 1]`` each atom's mass in systems with ``fix_com``, else 0; None: no such system.
        self.mass: torch.Tensor | None = None
        self._inv_total: torch.Tensor | None = None  # [B, 1] 1 / the system's mass (0: not held)
        self._inv_squares: torch.Tensor | None = None  # [B, 1] 1 / sum of squared masses
        self._version = -1
        self._work = Workspace()

    def write(self, batch: Batch) -> None:
        """Per-atom weights of the systems with ``fix_com`` (None where the batch has none), laid
        out when the systems change (a captured step keeps reading the same tensors)."""
        if FIX_COM not in batch:
            self.mass, self._version = None, -1
            return
        if self._version == batch.version:
            return
        self._version = batch.version
        held = getattr(batch, FIX_COM).reshape(-1).to(torch.bool)
        dtype, idx = batch.positions.dtype, batch.batch_idx
        mass = batch.atomic_masses.to(dtype) * held.index_select(0, idx).to(dtype)
        n = batch.num_graphs
        total = torch.zeros(n, dtype=dtype, device=batch.device).index_add_(0, idx, mass)
        squares = torch.zeros_like(total).index_add_(0, idx, mass * mass)
        self.mass = mass.view(-1, 1)
        self._inv_total = torch.where(total > 0, 1.0 / total, 0.0).view(-1, 1)
        self._inv_squares = torch.where(squares > 0, 1.0 / squares, 0.0).view(-1, 1)

    def _mean(self, batch: Batch, values: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
        """``[V, 3]`` each atom's system's ``sum(m v) * inv`` (0 in systems without ``fix_com``)."""
        assert self.mass is not None
        w = self._work
        n, v = batch.num_graphs, values.shape[0]
        weighted = w.get("weighted", v, batch.node_capacity, (3,), values.dtype, values.device)
        torch.mul(values, self.mass, out=weighted)
        sums = w.get("sums", n, batch.system_capacity, (3,), values.dtype, values.device)
        sums.zero_().index_add_(0, batch.batch_idx, weighted).mul_(inv)
        per_atom = w.get("per_atom", v, batch.node_capacity, (3,), values.dtype, values.device)
        return torch.index_select(sums, 0, batch.batch_idx, out=per_atom)

    def forces(self, batch: Batch) -> None:
        """Forces less ``m_i lambda`` with ``lambda = sum(m f) / sum(m^2)`` (the net force gone)."""
        assert self._inv_squares is not None and self.mass is not None
        lam = self._mean(batch, batch.forces, self._inv_squares)
        batch.forces.sub_(lam.mul_(self.mass))

    def positions(self, batch: Batch, start: torch.Tensor) -> None:
        """Positions shifted so each held system's centre of mass is that of ``start``."""
        assert self._inv_total is not None
        x = batch.positions
        step = self._work.get("com_step", x.shape[0], batch.node_capacity, (3,), x.dtype, x.device)
        torch.sub(start, x, out=step)
        x.add_(self._mean(batch, step, self._inv_total))

    def velocities(self, batch: Batch) -> None:
        """Velocities less each held system's centre-of-mass velocity."""
        assert self._inv_total is not None
        if "velocities" in batch:
            v = batch.velocities
            v.sub_(self._mean(batch, v, self._inv_total))


class Constraints:
    """The constraints of one engine's batch and what the step keeps of them.

    ``write`` (at each rewrite of the masks) reads the fields into ``[V, 3]`` bool ``held``, the
    symmetry operations (:mod:`alchemi_core.dynamics.symmetry`) and the centre-of-mass weights;
    ``adjust_forces`` runs after each model forward, ``keep``, ``project`` and ``settle`` around the
    stages' updates (see the module docstring).
    """

    def __init__(self) -> None:
        #: ``[V, 3]`` True for each held component; None while the batch holds nothing.
        self.held: torch.Tensor | None = None
        #: The space groups of the systems that keep theirs (``symprec``).
        self.symmetry = Symmetry()
        #: The systems whose centre of mass stays put (``fix_com``).
        self.com = CentreOfMass()
        #: Whether the step has anything to keep (held components, symmetry, a fixed centre of mass).
        self.active = False
        self._positions: torch.Tensor | None = None
        self._cells: torch.Tensor | None = None
        self._version = -1
        self._work = Workspace()

    def write(self, batch: Batch, moves_cell: bool) -> None:
        """Read ``frozen``/``frozen_axes`` of ``batch`` into :attr:`held` (buffers kept while the
        systems stay; rewritten in place, so a captured step sees them) and zero the held
        components' velocities, so no stage starts from a velocity it may not use; lay out the
        symmetry operations and centre-of-mass weights.

        Raises:
            InvalidDataError: ``frozen_axes`` not of shape ``[V, 3]``.
            MissingDependencyError: a system keeps its symmetry and spglib is not installed.
        """
        self.symmetry.write(batch)
        self.com.write(batch)
        holds = has_constraints(batch)
        self.active = holds or self.symmetry.active or self.com.mass is not None
        if not self.active:
            self.held = self._positions = self._cells = None
            return
        x = batch.positions
        if self._positions is None or self._version != batch.version or self._positions.shape != x.shape:
            self._positions = torch.empty_like(x)
            self.held = None
            self._version = batch.version
        cells = moves_cell and "cell" in batch
        if not cells:
            self._cells = None
        elif self._cells is None or self._cells.shape != batch.cell.shape:
            self._cells = torch.empty_like(batch.cell)
        if not holds:
            self.held = None
            return
        if self.held is None:
            self.held = torch.empty(x.shape, dtype=torch.bool, device=x.device)
        held = self.held
        if "frozen" in batch:
            held.copy_(batch.frozen.reshape(-1, 1).to(torch.bool).expand_as(held))
        else:
            held.zero_()
        if FROZEN_AXES in batch:
            axes = getattr(batch, FROZEN_AXES)
            if tuple(axes.shape) != tuple(held.shape):
                raise InvalidDataError(
                    f"the atom field {FROZEN_AXES!r} has shape {tuple(axes.shape)}; it takes one row of three bools "
                    f"per atom, {tuple(held.shape)} here (True: that Cartesian component held; whole atoms go "
                    "in the [V] bool field 'frozen')"
                )
            held.logical_or_(axes.to(torch.bool))
        if "velocities" in batch:
            batch.velocities.masked_fill_(held, 0.0)

    def adjust_forces(self, batch: Batch) -> None:
        """After a model forward: held components feel no force, the forces (and stress) of a
        system that keeps its symmetry are averaged over its group, a fixed centre of mass feels
        no net force."""
        if self.symmetry.active:
            self.symmetry.forces(batch)
        if self.com.mass is not None:
            self.com.forces(batch)
        hold_forces(batch)

    def keep(self, batch: Batch) -> None:
        """Before the stages' ``pre_update``: keep the positions (and cells) they start from."""
        assert self._positions is not None
        self._positions.copy_(batch.positions)
        if self._cells is not None:
            self._cells.copy_(batch.cell)

    def project(self, batch: Batch) -> None:
        """After the stages' ``pre_update``: a symmetric system's cell change and step averaged
        over its group, a fixed centre of mass put back, held components back where they were
        (all carried by the cell's deformation where it changed), their velocities zero."""
        kept = self._positions
        assert kept is not None
        if self._cells is not None:
            carry = self._carry(batch, self._cells)
            if self.symmetry.active:
                self.symmetry.cell_step(batch, self._cells, carry)
            kept = self._carried(batch, kept, carry)
        if self.symmetry.active:
            self.symmetry.position_step(batch, kept)
        if self.com.mass is not None:
            self.com.positions(batch, kept)
        x = batch.positions
        if self.held is not None:
            torch.where(self.held, kept, x, out=x)
        self.settle(batch)

    def settle(self, batch: Batch) -> None:
        """After the stages' ``post_update``: held components' velocities zero and a fixed centre
        of mass at rest (where the batch has velocities: an integrator may keep none)."""
        if self.com.mass is not None:
            self.com.velocities(batch)
        if self.held is not None and "velocities" in batch:
            batch.velocities.masked_fill_(self.held, 0.0)

    def _carry(self, batch: Batch, old: torch.Tensor) -> torch.Tensor:
        """``[B, 3, 3]`` each system's cell change ``cell_old^-1 cell_new`` (row vectors), exactly
        the identity for systems whose cell did not change; a kept buffer."""
        new = batch.cell
        rows, cap, dtype, dev = batch.num_graphs, batch.system_capacity, old.dtype, old.device
        work = self._work
        # cell_old^-1 from its adjugate (rows b x c, c x a, a x b of its transpose, over the
        # determinant): no pivoting and no error check, which would read back; a cell a stage
        # moves is far from singular, and one that did not change is not inverted at all (below).
        a, b, c = old[:, 0], old[:, 1], old[:, 2]
        adjugate_t = work.get("adjugate_t", rows, cap, (3, 3), dtype, dev)
        torch.linalg.cross(b, c, out=adjugate_t[:, 0])
        torch.linalg.cross(c, a, out=adjugate_t[:, 1])
        torch.linalg.cross(a, b, out=adjugate_t[:, 2])
        det = work.get("det", rows, cap, (), dtype, dev)
        torch.linalg.vecdot(a, adjugate_t[:, 0], out=det)
        carry = work.get("carry", rows, cap, (3, 3), dtype, dev)
        torch.matmul(adjugate_t.transpose(-1, -2), new, out=carry)
        carry.div_(det.view(-1, 1, 1))
        equal = work.get("equal", rows, cap, (3, 3), torch.bool, dev)
        same = work.get("same", rows, cap, (), torch.bool, dev)
        torch.eq(old, new, out=equal)
        torch.all(equal.view(rows, 9), dim=1, out=same)
        eye = work.get("eye", 1, 1, (3, 3), dtype, dev)
        torch.eye(3, dtype=dtype, device=dev, out=eye[0])
        torch.where(same.view(-1, 1, 1), eye, carry, out=carry)
        return carry

    def _carried(self, batch: Batch, kept: torch.Tensor, carry: torch.Tensor) -> torch.Tensor:
        """``kept`` positions mapped by each system's cell change ``carry``, into a kept buffer."""
        work, dtype, dev = self._work, carry.dtype, carry.device
        per_atom = work.get("per_atom", batch.num_nodes, batch.node_capacity, (3, 3), dtype, dev)
        torch.index_select(carry, 0, batch.batch_idx, out=per_atom)
        carried = work.get("carried", batch.num_nodes, batch.node_capacity, (1, 3), dtype, dev)
        torch.bmm(kept.unsqueeze(1).to(dtype), per_atom, out=carried)
        return carried.squeeze(1).to(kept.dtype)
