"""Fixed atoms and fixed Cartesian components: the one place every step honours constraints.

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

Only batches with such fields pay for it; buffers are allocated when the batch's systems
change, never per step, and nothing is read back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from alchemi_core.data.fields import FROZEN_AXES
from alchemi_core.errors import InvalidDataError
from alchemi_core.workspace import Workspace

if TYPE_CHECKING:
    from alchemi_core.data import Batch

__all__ = ["FROZEN_AXES", "Constraints", "free_components", "has_constraints", "hold_forces"]


def has_constraints(batch: Batch) -> bool:
    """Whether ``batch`` holds some atom or component fixed (has ``frozen`` or ``frozen_axes``)."""
    return "frozen" in batch or FROZEN_AXES in batch


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


class Constraints:
    """The held components of one engine's batch and what the step keeps of them.

    ``write`` (at each rewrite of the masks) reads the fields into ``[V, 3]`` bool ``held``;
    ``keep``, ``project`` and ``settle`` run inside the step (see the module docstring).
    """

    def __init__(self) -> None:
        #: ``[V, 3]`` True for each held component; None while the batch holds nothing.
        self.held: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None
        self._cells: torch.Tensor | None = None
        self._version = -1
        self._work = Workspace()

    def write(self, batch: Batch, moves_cell: bool) -> None:
        """Read ``frozen``/``frozen_axes`` of ``batch`` into :attr:`held` (buffers kept while the
        systems stay; rewritten in place, so a captured step sees them) and zero the held
        components' velocities, so no stage starts from a velocity it may not use.

        Raises:
            InvalidDataError: ``frozen_axes`` not of shape ``[V, 3]``.
        """
        if not has_constraints(batch):
            self.held = self._positions = self._cells = None
            return
        x = batch.positions
        if self.held is None or self._version != batch.version or self.held.shape != x.shape:
            self.held = torch.empty(x.shape, dtype=torch.bool, device=x.device)
            self._positions = torch.empty_like(x)
            self._version = batch.version
        cells = moves_cell and "cell" in batch
        if not cells:
            self._cells = None
        elif self._cells is None or self._cells.shape != batch.cell.shape:
            self._cells = torch.empty_like(batch.cell)
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

    def keep(self, batch: Batch) -> None:
        """Before the stages' ``pre_update``: keep the positions (and cells) they start from."""
        assert self._positions is not None
        self._positions.copy_(batch.positions)
        if self._cells is not None:
            self._cells.copy_(batch.cell)

    def project(self, batch: Batch) -> None:
        """After the stages' ``pre_update``: held components back where they were (carried by
        the cell's deformation where it changed), their velocities zero."""
        held, kept = self.held, self._positions
        assert held is not None and kept is not None
        if self._cells is not None:
            kept = self._carried(batch, kept, self._cells)
        x = batch.positions
        torch.where(held, kept, x, out=x)
        self.settle(batch)

    def settle(self, batch: Batch) -> None:
        """After the stages' ``post_update``: held components' velocities zero (where the batch
        has velocities: an integrator may keep none)."""
        assert self.held is not None
        if "velocities" in batch:
            batch.velocities.masked_fill_(self.held, 0.0)

    def _carried(self, batch: Batch, kept: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        """``kept`` positions mapped by each system's cell change ``cell_old^-1 cell_new`` (row
        vectors), exactly ``kept`` for systems whose cell did not change; into kept buffers."""
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
        per_atom = work.get("per_atom", batch.num_nodes, batch.node_capacity, (3, 3), dtype, dev)
        torch.index_select(carry, 0, batch.batch_idx, out=per_atom)
        carried = work.get("carried", batch.num_nodes, batch.node_capacity, (1, 3), dtype, dev)
        torch.bmm(kept.unsqueeze(1).to(dtype), per_atom, out=carried)
        return carried.squeeze(1).to(kept.dtype)
