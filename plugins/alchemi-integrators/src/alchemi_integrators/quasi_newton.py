"""L-BFGS and BFGS geometry optimisers (``integrator:lbfgs``, ``integrator:bfgs``), ASE's algorithms batched.

Both take, at each step, the forces of the current positions and move every system of the batch
by its own quasi-Newton step ``dr = -H g`` (``g`` the gradient, minus the forces), scaled down so
that its longest row (an atom's displacement, or a cell filter's row) is at most ``maxstep``: the
line-search-free step control of ASE's ``LBFGS`` and ``BFGS``, which these follow step for step.
Each system keeps its own history; systems enter (a fresh history), converge and leave on their
own, so inflight refills and fused stages work as with FIRE.

**L-BFGS** (ASE's ``ase.optimize.LBFGS``): the inverse Hessian is ``1/alpha`` times the identity
updated by the last ``memory`` pairs ``s = x_k - x_(k-1)``, ``y = g_k - g_(k-1)``; the step is
``damping * dr``. ASE applies it by the two-loop recursion; here it is applied in the equivalent
compact form of Byrd, Nocedal and Schnabel (Math. Prog. 63, 129, 1994):
``H g = g/alpha + S p1 + Y p2/alpha`` with ``p2 = -R^-1 S^T g`` and
``p1 = R^-T (-(D + Y^T Y/alpha) p2 - Y^T g/alpha)`` (``R`` the upper triangle of ``S^T Y`` in the
order the pairs came, ``D`` its diagonal). The same vector in exact arithmetic, but two passes
over the history (one batched product for every dot product a step needs, one for the result)
instead of ``2 memory`` dependent reductions, and the per-system ``memory x memory`` triangular
solves are batched torch calls; ``S^T Y`` and ``Y^T Y`` are kept up to date one row and column per
step. The history lives in an atom field (``[V, 2 memory, 3]``: each atom's rows of ``S`` and
``Y``) that travels with its system. A pair with ``s . y = 0`` (a system that did not move) is
skipped, where ASE would divide by zero.

**BFGS** (ASE's ``ase.optimize.BFGS``): each system keeps a dense Hessian, ``alpha`` times the
identity at the start, updated by ``H += y y^T / (s . y) - (H s)(H s)^T / (s . H s)`` (skipped when
no coordinate moved by 1e-7 Å or more), and steps by ``dr = -V (V^T g / |w|)`` with ``w, V`` its
eigenvalues and eigenvectors. The Hessians are ``[B, D, D]`` with ``D = 3 max_atoms`` (plus 9 with
a cell filter), systems padded with the identity beyond their atoms; memory and the batched
eigendecomposition grow as ``D^2`` and ``D^3``, so BFGS suits systems of up to a few hundred
atoms (L-BFGS has no such limit). On a GPU, ``torch.linalg.eigh`` synchronises with the host
(it checks its convergence there), so BFGS's step reads back once and cannot be captured as a CUDA
graph (``compile()`` says so); L-BFGS's step reads nothing back.

**Why batched torch and not Warp kernels.** The per-system linear algebra (triangular solves for
L-BFGS, a symmetric eigendecomposition for BFGS) has no Warp equivalent; what is left around it
is batched products and index additions that torch already fuses well, so a single torch
implementation runs on CPUs and GPUs alike.

**Cell filters and constraints.** ``cell_filter="frechet"`` or ``"unit"`` relaxes the cell too,
exactly as FIRE does (:mod:`alchemi_integrators.cell_filter`): the optimiser's coordinates are the
atoms' positions in the undeformed cell and three rows of cell degrees of freedom per system,
its forces the filter's, and ``fmax`` counts both. Held atoms and components (``frozen``,
``frozen_axes``) have zero forces, so zero steps, and the engine keeps them
(:mod:`alchemi_core.dynamics.constraints`), as ASE's ``FixAtoms`` and ``FixCartesian`` do.

Example:
    >>> from alchemi_core import registry
    >>> from alchemi_core.dynamics import ConvergenceHook
    >>> relax = registry.build("integrator:lbfgs", model=model, n_steps=500, cell_filter="frechet",
    ...                        convergence_hook=ConvergenceHook.from_fmax(0.05))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from alchemi_core.errors import ConfigurationError
from alchemi_core.validation import whole_number
from alchemi_integrators.base import Integrator
from alchemi_integrators.cell_filter import (
    CELL_DOF,
    CELL_FILTER_FMAX,
    CELL_REFERENCE,
    CELL_VELOCITY,
    CellFilter,
    attach_cell_filter,
)
from alchemi_integrators.cell_math import inv3
from alchemi_integrators.parameters import ParameterValue

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: Per-system state of both optimisers (batch fields, reset when a system enters the stage):
#: steps taken, and the coordinates and gradient of the last step (the atoms', then the cell's).
QN_STEPS = "qn_steps"
QN_PREVIOUS_X = "qn_previous_x"
QN_PREVIOUS_G = "qn_previous_gradient"
QN_PREVIOUS_CELL_X = "qn_previous_cell_x"
QN_PREVIOUS_CELL_G = "qn_previous_cell_gradient"
#: L-BFGS's history: each atom's (and cell row's) s and y of every slot, the slots' dot products
#: ``S^T Y`` and ``Y^T Y``, and the step each slot was written at (0: empty).
LBFGS_HISTORY = "lbfgs_history"
LBFGS_CELL_HISTORY = "lbfgs_cell_history"
LBFGS_SY = "lbfgs_sy"
LBFGS_YY = "lbfgs_yy"
LBFGS_STAMP = "lbfgs_stamp"
#: BFGS's dense Hessian per system.
BFGS_HESSIAN = "bfgs_hessian"

_FILTER_FIELDS = (CELL_REFERENCE, CELL_DOF, CELL_VELOCITY)


class Rows(NamedTuple):
    """The optimiser's coordinates as ``[R, 3]`` rows: the atoms, then (with a cell filter) three
    cell rows per system; buffers kept while the batch's systems stay."""

    x: torch.Tensor
    g: torch.Tensor
    previous_x: torch.Tensor
    previous_g: torch.Tensor
    step: torch.Tensor
    system: torch.Tensor


class _QuasiNewton(Integrator):
    """What L-BFGS and BFGS share: parameters, the cell filter, the rows, the step cap and the move."""

    #: Optimisers' velocities are not physical: systems leave at rest (the engine zeroes them).
    velocities_are_physical = False

    def __init__(
        self,
        model: Any,
        n_steps: int,
        maxstep: ParameterValue,
        alpha: ParameterValue,
        *,
        cell_filter: str | None = None,
        scalar_pressure: ParameterValue | None = None,
        hydrostatic_strain: bool = False,
        constant_volume: bool = False,
        mask: Sequence[bool] | Sequence[Sequence[bool]] | torch.Tensor | None = None,
        cell_factor: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, n_steps=n_steps, **kwargs)
        self.declare("maxstep", maxstep, unit="Å", low=0.0, low_open=True)
        self.declare("alpha", alpha, unit="eV/Å²", low=0.0, low_open=True)
        #: The cell filter (None: the cell stays as it is).
        self.cell_filter: CellFilter | None = attach_cell_filter(
            self, cell_filter, scalar_pressure, hydrostatic_strain=hydrostatic_strain,
            constant_volume=constant_volume, mask=mask, cell_factor=cell_factor,
        )

    @property
    def mask_values_in_step(self) -> bool:  # type: ignore[override]
        """As FIRE: the values derived from the masks are built on the device alone."""
        return self.cell_filter is None

    @property
    def fmax_field(self) -> str | None:  # type: ignore[override]
        """With a cell filter, the filter's fmax (atoms and cell, ASE's criterion)."""
        return None if self.cell_filter is None else CELL_FILTER_FMAX

    # ------------------------------------------------------------------ state
    def create_state(self, batch: Batch) -> None:
        dtype = batch.positions.dtype
        self.ensure_field(batch, QN_STEPS, (), torch.int64, "system")
        self.ensure_field(batch, QN_PREVIOUS_X, (3,), dtype, "node")
        self.ensure_field(batch, QN_PREVIOUS_G, (3,), dtype, "node")
        if self.cell_filter is not None:
            for name in (*_FILTER_FIELDS, QN_PREVIOUS_CELL_X, QN_PREVIOUS_CELL_G):
                self.ensure_field(batch, name, (3, 3), dtype, "system")
            self.ensure_field(batch, CELL_FILTER_FMAX, (), dtype, "system")

    def init_state(self, batch: Batch, entering: torch.Tensor) -> None:
        """Entering systems start a fresh history (and, with a filter, take their cell as reference)."""
        getattr(batch, QN_STEPS).masked_fill_(entering, 0)
        if self.cell_filter is not None:
            self.cell_filter.reset(batch, entering)
            getattr(batch, CELL_FILTER_FMAX).masked_fill_(entering, float("inf"))

    # ------------------------------------------------------------------ the step
    def pre_update(self, batch: Batch) -> None:
        """The whole step, from the forces of the current positions (as ASE's ``step``)."""
        rows = self._rows(batch)
        self._gather(batch, rows)
        active = self._active(batch)
        fresh = getattr(batch, QN_STEPS) == 0
        self.direction(batch, rows, active, fresh)
        # ASE's cap: the whole step scaled so its longest row is at most maxstep.
        lengths = torch.linalg.vector_norm(rows.step, dim=-1)
        longest = torch.zeros(batch.num_graphs, dtype=lengths.dtype, device=lengths.device)
        longest.scatter_reduce_(0, rows.system, lengths, reduce="amax", include_self=True)
        maxstep = self.per_system("maxstep", batch)
        scale = torch.where(longest >= maxstep, maxstep / longest.clamp(min=torch.finfo(longest.dtype).tiny), 1.0)
        scale = (scale * self.step_factor(batch)).index_select(0, rows.system).unsqueeze(-1)
        # A where, not a product: systems outside the stage keep still even with non-finite values.
        moving = (active > 0).index_select(0, rows.system).unsqueeze(-1)
        rows.step.copy_(torch.where(moving, rows.step * scale, 0.0))
        getattr(batch, QN_STEPS).add_(active.to(torch.int64))
        self._keep_previous(batch, rows, moving)
        self._move(batch, rows)

    def post_update(self, batch: Batch) -> None:
        # With a cell filter, the filter's fmax of the new positions, for the convergence check.
        if self.cell_filter is None:
            return
        dtype, dev = batch.positions.dtype, batch.device
        atom = self.work.get("filter_atom_forces", batch.num_nodes, batch.node_capacity, (3,), dtype, dev)
        _, cell = self.cell_filter.forces(batch, self.per_system("scalar_pressure", batch), atom)
        self.cell_filter.fmax(batch, atom, cell, getattr(batch, CELL_FILTER_FMAX))

    def direction(self, batch: Batch, rows: Rows, active: torch.Tensor, fresh: torch.Tensor) -> None:
        """Write ``-H g`` into ``rows.step`` and update the history of the ``active`` systems
        (``[B]`` 1.0/0.0); ``fresh`` (``[B]`` bool) marks systems at their first step here."""
        raise NotImplementedError

    def step_factor(self, batch: Batch) -> torch.Tensor | float:
        """What the capped step is multiplied by (L-BFGS's damping)."""
        return 1.0

    # ------------------------------------------------------------------ rows
    def _active(self, batch: Batch) -> torch.Tensor:
        active = self.active(batch)
        if active is not None:
            return active
        return self.cached("all_active", batch, lambda: torch.ones(batch.num_graphs, dtype=batch.positions.dtype,
                                                                    device=batch.device), reads_fields=False,
                           masks=False)

    def _rows(self, batch: Batch) -> Rows:
        def build() -> Rows:
            n, b = batch.num_nodes, batch.num_graphs
            r = n if self.cell_filter is None else n + 3 * b
            dtype, dev = batch.positions.dtype, batch.device
            x, g, px, pg, step = (torch.zeros(r, 3, dtype=dtype, device=dev) for _ in range(5))
            system = batch.batch_idx
            if self.cell_filter is not None:
                system = torch.cat([system, torch.arange(b, device=dev).repeat_interleave(3)])
            return Rows(x, g, px, pg, step, system)

        return self.cached("qn_rows", batch, build, reads_fields=False, masks=False)

    def _gather(self, batch: Batch, rows: Rows) -> None:
        """The current coordinates and gradient, and the previous step's, into ``rows``."""
        n = batch.num_nodes
        rows.previous_x[:n].copy_(getattr(batch, QN_PREVIOUS_X))
        rows.previous_g[:n].copy_(getattr(batch, QN_PREVIOUS_G))
        if self.cell_filter is None:
            rows.x.copy_(batch.positions)
            torch.neg(batch.forces, out=rows.g)
            return
        # The filter's coordinates: positions in the undeformed cell (x F^-T) and the cell's.
        f_inv_t = inv3(self.cell_filter.deformation(batch)).transpose(-1, -2)
        torch.bmm(batch.positions.unsqueeze(1), f_inv_t.index_select(0, batch.batch_idx),
                  out=rows.x[:n].unsqueeze(1))
        rows.x[n:].copy_(getattr(batch, CELL_DOF).reshape(-1, 3))
        _, cell_forces = self.cell_filter.forces(batch, self.per_system("scalar_pressure", batch), rows.g[:n])
        rows.g[n:].copy_(cell_forces.reshape(-1, 3))
        rows.g.neg_()
        rows.previous_x[n:].copy_(getattr(batch, QN_PREVIOUS_CELL_X).reshape(-1, 3))
        rows.previous_g[n:].copy_(getattr(batch, QN_PREVIOUS_CELL_G).reshape(-1, 3))

    def _keep_previous(self, batch: Batch, rows: Rows, moving: torch.Tensor) -> None:
        """This step's coordinates and gradient, for the next step's pair; only for the systems
        this stage moves (another stage of a fused stage may keep its own in the same fields)."""
        torch.where(moving, rows.x, rows.previous_x, out=rows.previous_x)
        torch.where(moving, rows.g, rows.previous_g, out=rows.previous_g)
        n = batch.num_nodes
        getattr(batch, QN_PREVIOUS_X).copy_(rows.previous_x[:n])
        getattr(batch, QN_PREVIOUS_G).copy_(rows.previous_g[:n])
        if self.cell_filter is not None:
            getattr(batch, QN_PREVIOUS_CELL_X).view(-1, 3).copy_(rows.previous_x[n:])
            getattr(batch, QN_PREVIOUS_CELL_G).view(-1, 3).copy_(rows.previous_g[n:])

    def _move(self, batch: Batch, rows: Rows) -> None:
        n = batch.num_nodes
        if self.cell_filter is None:
            batch.positions.add_(rows.step)
            return
        cell_step = rows.step[n:].reshape(-1, 3, 3)
        self.cell_filter.move(batch, rows.step[:n], cell_step, self.context.system_mask)


class LBFGS(_QuasiNewton):
    """L-BFGS as in ASE (see the module docstring).

    Args:
        model: Returns ``energy`` ``[B, 1]`` and ``forces`` ``[V, 3]`` (and stress with a cell filter).
        n_steps: Most steps (each system stops when its convergence hook says so).
        maxstep: Largest displacement of an atom (or cell row) per step, in Å (ASE: 0.2).
        memory: Pairs of the history each system keeps (ASE: 100); memory and time per step grow
            with it.
        damping: Factor applied to each capped step (ASE: 1).
        alpha: Initial Hessian guess in eV/Å² (ASE: 70): the first step is ``F / alpha``.
        **kwargs: The cell filter's options (``cell_filter``, ``scalar_pressure``,
            ``hydrostatic_strain``, ``constant_volume``, ``mask``, ``cell_factor``: as FIRE's) and
            ``BaseDynamics``'s arguments (``convergence_hook``, ...).

    ``maxstep``, ``damping`` and ``alpha`` take a number, a ``[B]`` tensor or a field name.

    Example:
        >>> from alchemi_core.dynamics import ConvergenceHook
        >>> relax = LBFGS(model, memory=20, convergence_hook=ConvergenceHook.from_fmax(0.05))  # doctest: +SKIP
    """

    def __init__(
        self,
        model: Any,
        n_steps: int = 1000,
        maxstep: ParameterValue = 0.2,
        memory: int = 100,
        damping: ParameterValue = 1.0,
        alpha: ParameterValue = 70.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, n_steps, maxstep, alpha, **kwargs)
        self.memory = whole_number("LBFGS memory", memory, minimum=1)
        self.declare("damping", damping, low=0.0, low_open=True)

    def create_state(self, batch: Batch) -> None:
        super().create_state(batch)
        m, dtype = self.memory, batch.positions.dtype
        self.ensure_field(batch, LBFGS_HISTORY, (2 * m, 3), dtype, "node")
        if self.cell_filter is not None:
            self.ensure_field(batch, LBFGS_CELL_HISTORY, (3, 2 * m, 3), dtype, "system")
        self.ensure_field(batch, LBFGS_SY, (m, m), dtype, "system")
        self.ensure_field(batch, LBFGS_YY, (m, m), dtype, "system")
        self.ensure_field(batch, LBFGS_STAMP, (m,), torch.int64, "system")

    def init_state(self, batch: Batch, entering: torch.Tensor) -> None:
        super().init_state(batch, entering)
        # Zeroed, not only marked empty: an empty slot's rows are multiplied by 0 (a leftover NaN would stay).
        getattr(batch, LBFGS_HISTORY).masked_fill_(entering.index_select(0, batch.batch_idx).view(-1, 1, 1), 0.0)
        if self.cell_filter is not None:
            getattr(batch, LBFGS_CELL_HISTORY).masked_fill_(entering.view(-1, 1, 1, 1), 0.0)
        getattr(batch, LBFGS_STAMP).masked_fill_(entering.view(-1, 1), 0)

    def step_factor(self, batch: Batch) -> torch.Tensor:
        return self.per_system("damping", batch)

    def _history(self, batch: Batch) -> list[tuple[torch.Tensor, slice]]:
        """The history's parts with the rows they belong to: the atoms' and the cell's."""
        n = batch.num_nodes
        atoms = getattr(batch, LBFGS_HISTORY)
        if atoms.shape[1] != 2 * self.memory:  # (shapes are host data: no read-back)
            raise ConfigurationError(
                f"{self.name}: the batch's L-BFGS history holds {atoms.shape[1] // 2} pairs, this stage keeps "
                f"{self.memory}; L-BFGS stages of one fused stage share it: give them the same memory"
            )
        parts = [(atoms, slice(0, n))]
        if self.cell_filter is not None:
            parts.append((getattr(batch, LBFGS_CELL_HISTORY).view(-1, 2 * self.memory, 3), slice(n, None)))
        return parts

    def direction(self, batch: Batch, rows: Rows, active: torch.Tensor, fresh: torch.Tensor) -> None:
        m, b = self.memory, batch.num_graphs
        sys = rows.system
        dtype, dev = rows.x.dtype, rows.x.device
        s = rows.x - rows.previous_x
        y = rows.g - rows.previous_g
        curvature = torch.zeros(b, dtype=dtype, device=dev).index_add_(0, sys, (s * y).sum(-1))
        wrote = (active > 0) & ~fresh & (curvature != 0)
        steps = getattr(batch, QN_STEPS)
        slot = torch.remainder(steps - 1, m)
        # The new pair goes into slot (steps - 1) mod m: the ring keeps the last m pairs, as ASE's lists.
        write_row = wrote.index_select(0, sys).unsqueeze(-1)
        slot_row = slot.index_select(0, sys).view(-1, 1, 1).expand(-1, 1, 3)
        # Every dot product a step needs in one pass over the history: each slot's s and y with
        # (y_new, g, s_new), per row, then summed over each system's rows.
        vectors = torch.stack([y, rows.g, s], dim=-1)  # [R, 3, 3]
        capacity = batch.node_capacity + (0 if self.cell_filter is None else 3 * batch.system_capacity)
        products = self.work.get("lbfgs_products", sys.shape[0], capacity, (2 * m, 3), dtype, dev)
        dots = torch.zeros(b, 2 * m, 3, dtype=dtype, device=dev)
        for history, part in self._history(batch):
            for offset, new in ((0, s), (m, y)):
                idx = slot_row[part] + offset
                old = history.gather(1, idx).squeeze(1)
                history.scatter_(1, idx, torch.where(write_row[part], new[part], old).unsqueeze(1))
            torch.bmm(history, vectors[part], out=products[part])
            dots.index_add_(0, sys[part], products[part])
        s_dots, y_dots = dots[:, :m], dots[:, m:]
        s_y_new, g_s = s_dots[..., 0], s_dots[..., 1]
        y_y_new, g_y, s_new_y = y_dots[..., 0], y_dots[..., 1], y_dots[..., 2]
        stamp = getattr(batch, LBFGS_STAMP)
        column = (torch.arange(m, device=dev) == slot.unsqueeze(-1)) & wrote.unsqueeze(-1)
        stamp.copy_(torch.where(column, steps.unsqueeze(-1), stamp))
        sy, yy = getattr(batch, LBFGS_SY), getattr(batch, LBFGS_YY)
        sy.copy_(torch.where(column.unsqueeze(1), s_y_new.unsqueeze(-1), sy))  # s_j . y_new
        sy.copy_(torch.where(column.unsqueeze(2), s_new_y.unsqueeze(1), sy))  # s_new . y_j
        yy.copy_(torch.where(column.unsqueeze(1), y_y_new.unsqueeze(-1), yy))
        yy.copy_(torch.where(column.unsqueeze(2), y_y_new.unsqueeze(1), yy))
        p = self._coefficients(batch, stamp, sy, yy, g_s, g_y)  # [B, 2m]
        # -H g = -(g / alpha + S p1 + Y p2 / alpha)
        inv_alpha = (1.0 / self.per_system("alpha", batch)).index_select(0, sys).unsqueeze(-1)
        coeff = p.index_select(0, sys).unsqueeze(1)
        for history, part in self._history(batch):
            torch.bmm(coeff[part], history, out=rows.step[part].unsqueeze(1))
        rows.step.addcmul_(rows.g, inv_alpha).neg_()

    def _coefficients(
        self, batch: Batch, stamp: torch.Tensor, sy: torch.Tensor, yy: torch.Tensor, g_s: torch.Tensor,
        g_y: torch.Tensor,
    ) -> torch.Tensor:
        """``[B, 2m]``: ``p1`` and ``p2 / alpha`` of the compact form (0 for empty slots), each
        system's slots solved in the order their pairs came."""
        m = self.memory
        inv_alpha = (1.0 / self.per_system("alpha", batch)).view(-1, 1, 1)
        valid = stamp > 0
        order = torch.argsort(torch.where(valid, stamp, 0), dim=1)  # empty slots first, then oldest to newest
        valid_c = valid.gather(1, order)
        both = valid_c.unsqueeze(-1) & valid_c.unsqueeze(-2)
        rows_c = order.unsqueeze(-1).expand(-1, m, m)
        cols_c = order.unsqueeze(1).expand(-1, m, m)
        sy_c = sy.gather(1, rows_c).gather(2, cols_c) * both
        yy_c = yy.gather(1, rows_c).gather(2, cols_c) * both
        diag = torch.diagonal(sy_c, dim1=-2, dim2=-1).unsqueeze(-1)
        r = torch.triu(sy_c) + torch.diag_embed((~valid_c).to(sy.dtype))
        u = (g_s.gather(1, order) * valid_c).unsqueeze(-1)
        v = (g_y.gather(1, order) * valid_c).unsqueeze(-1)
        p2 = -torch.linalg.solve_triangular(r, u, upper=True)
        rhs = -(diag * p2 + inv_alpha * (yy_c @ p2)) - inv_alpha * v
        p1 = torch.linalg.solve_triangular(r.transpose(-1, -2), rhs, upper=False)
        chrono = torch.cat([p1, p2 * inv_alpha], dim=1).squeeze(-1)  # [B, 2m]
        out = torch.empty_like(chrono)
        return out.scatter_(1, torch.cat([order, order + m], dim=1), chrono)


class BFGS(_QuasiNewton):
    """BFGS as in ASE (see the module docstring).

    Args:
        model: Returns ``energy`` ``[B, 1]`` and ``forces`` ``[V, 3]`` (and stress with a cell filter).
        n_steps: Most steps (each system stops when its convergence hook says so).
        maxstep: Largest displacement of an atom (or cell row) per step, in Å (ASE: 0.2).
        alpha: Initial Hessian in eV/Å² (ASE: 70).
        max_atoms: The largest system the Hessians hold (None: the largest of the batch a run
            starts with). A run fed by a sampler should name it: a larger system entering is an error.
        **kwargs: The cell filter's options (as FIRE's) and ``BaseDynamics``'s arguments.

    Raises:
        ConfigurationError: A system with more than ``max_atoms`` atoms enters the stage.

    Example:
        >>> relax = BFGS(model, max_atoms=64, cell_filter="frechet")  # doctest: +SKIP
    """

    def __init__(
        self,
        model: Any,
        n_steps: int = 1000,
        maxstep: ParameterValue = 0.2,
        alpha: ParameterValue = 70.0,
        *,
        max_atoms: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, n_steps, maxstep, alpha, **kwargs)
        self.max_atoms = None if max_atoms is None else whole_number("BFGS max_atoms", max_atoms, minimum=1)
        self._size = 0  # the Hessians' atoms in this run

    def create_state(self, batch: Batch) -> None:
        super().create_state(batch)
        self._size = self.max_atoms or max(1, int(batch.num_nodes_per_system.max(initial=0)))
        extra = 0 if self.cell_filter is None else 3
        d = 3 * (self._size + extra)
        self.ensure_field(batch, BFGS_HESSIAN, (d, d), batch.positions.dtype, "system")

    def init_state(self, batch: Batch, entering: torch.Tensor) -> None:
        super().init_state(batch, entering)
        h = getattr(batch, BFGS_HESSIAN)
        eye = torch.eye(h.shape[-1], dtype=h.dtype, device=h.device)
        start = eye * self.per_system("alpha", batch).view(-1, 1, 1)
        h.copy_(torch.where(entering.view(-1, 1, 1), start, h))

    def compile(self, **kwargs: Any) -> BFGS:
        """Not available: the eigendecomposition synchronises with the host (module docstring)."""
        raise ConfigurationError(
            f"{self.name}: BFGS's step cannot be captured as a CUDA graph (torch.linalg.eigh synchronises "
            "with the host); run it without compile(), or use LBFGS, whose step can be captured"
        )

    def _padded(self, batch: Batch, rows: Rows) -> torch.Tensor:
        """``[3R]`` index of each row component in the systems' padded ``[B * D]`` vectors."""

        def build() -> torch.Tensor:
            largest = int(batch.num_nodes_per_system.max(initial=0))
            if largest > self._size:
                raise ConfigurationError(
                    f"{self.name}: a system of {largest} atoms entered, but the Hessians hold {self._size} "
                    f"atoms; pass BFGS(max_atoms={largest}) or more"
                )
            d = getattr(batch, BFGS_HESSIAN).shape[-1]
            idx = batch.batch_idx
            local = torch.arange(batch.num_nodes, device=batch.device) - batch.batch_ptr.index_select(0, idx)
            row_start = idx * d + 3 * local
            if self.cell_filter is not None:
                cells = torch.arange(batch.num_graphs, device=batch.device).repeat_interleave(3)
                row_start = torch.cat([row_start, cells * d + 3 * self._size + 3 * torch.arange(3, device=batch.device)
                                       .repeat(batch.num_graphs)])
            return (row_start.unsqueeze(-1) + torch.arange(3, device=batch.device)).reshape(-1)

        return self.cached("bfgs_padded", batch, build, reads_fields=False, masks=False)

    def direction(self, batch: Batch, rows: Rows, active: torch.Tensor, fresh: torch.Tensor) -> None:
        h = getattr(batch, BFGS_HESSIAN)
        b, d = h.shape[0], h.shape[-1]
        index = self._padded(batch, rows)

        def padded(values: torch.Tensor) -> torch.Tensor:
            out = torch.zeros(b * d, dtype=values.dtype, device=values.device)
            return out.index_copy_(0, index, values.reshape(-1)).view(b, d)

        ds = padded(rows.x - rows.previous_x)
        dg = padded(rows.g - rows.previous_g)
        g = padded(rows.g)
        # ASE skips the update where nothing moved (its restarts); here also outside the stage.
        moved = ds.abs().amax(dim=-1) >= 1e-7
        update = (active > 0) & ~fresh & moved
        a = (ds * dg).sum(-1, keepdim=True)
        hs = torch.bmm(h, ds.unsqueeze(-1)).squeeze(-1)
        c = (ds * hs).sum(-1, keepdim=True)
        tiny = torch.finfo(h.dtype).tiny
        a = torch.where(a == 0, tiny, a)
        c = torch.where(c == 0, tiny, c)
        change = dg.unsqueeze(-1) * (dg / a).unsqueeze(1) - hs.unsqueeze(-1) * (hs / c).unsqueeze(1)
        h.add_(torch.where(update.view(-1, 1, 1), change, 0.0))
        omega, vectors = torch.linalg.eigh(h)
        step = -torch.bmm(vectors, (torch.bmm(g.unsqueeze(1), vectors).squeeze(1) / omega.abs()).unsqueeze(-1))
        rows.step.view(-1).copy_(step.view(-1).index_select(0, index))
