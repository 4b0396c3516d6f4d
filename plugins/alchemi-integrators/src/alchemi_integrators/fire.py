"""FIRE and FIRE 2.0 geometry optimisers (``integrator:fire``, ``integrator:fire2``).

Both move atoms with damped dynamics whose velocity is steered towards the force, with a time
step that grows while the power ``P = F . v`` of a system stays positive and is cut (and the
velocities zeroed) when it turns negative. Every quantity is per system: each system of a batch
has its own time step, mixing factor and counters (batch fields that travel with the system), and
``P``, ``|v|`` and ``|F|`` are sums over the system's atoms, computed on the device.

**FIRE** (Bitzek et al., PRL 97, 170201, 2006) as ASE's ``ase.optimize.FIRE`` implements it:
at each step, with forces F of the current positions,

* (from the second step on) if P > 0: ``v <- (1 - a) v + a |v| F/|F|`` and, after more than
  ``n_min`` such steps in a row, ``dt <- min(dt f_inc, dt_max)``, ``a <- a f_alpha``;
  otherwise ``v <- 0``, ``a <- alpha_start``, ``dt <- dt f_dec``;
* ``v <- v + dt F/m``; ``x <- x + dt v`` (semi-implicit Euler), the displacement capped by
  ``maxstep``.

Unlike ASE, which gives every atom unit mass and its own time unit, the kick divides by the
atomic masses and dt is in fs: for a single element of mass m, this is ASE's FIRE with
``dt_ASE = dt_fs * sqrt(ACCELERATION / m)`` (and the same for ``dt_max``); for argon,
ASE's defaults ``dt=0.1, dtmax=1.0`` correspond to 6.43 and 64.3 fs.

**FIRE 2.0** (Guénolé et al., Comput. Mater. Sci. 175, 109584, 2020), with the semi-implicit
Euler integrator of its Algorithm 2:

* if P > 0: count it; after more than ``n_delay`` positive steps in a row,
  ``dt <- min(dt f_inc, dt_max)``, ``a <- a f_alpha``;
* if P <= 0: reset the count; unless within the first ``n_delay`` steps (``initial_delay``),
  ``dt <- dt f_dec`` (not below ``dt_min``) and ``a <- alpha_start``; move back half a step,
  ``x <- x - dt/2 v`` (``half_step_back``), and set ``v <- 0``;
* ``v <- v + dt F/m``, then if P > 0 mix ``v <- (1 - a) v + a |v| F/|F|`` (|v| and |F| of the
  start of the step, as in the LAMMPS implementation by the same authors), then ``x <- x + dt v``.

The run stops each system by its convergence hook (e.g. ``ConvergenceHook.from_fmax(0.05)``); the
paper's cap on consecutive negative-power steps is not applied.

**Cell relaxation.** ``cell_filter="frechet"`` or ``"unit"`` relaxes each system's cell with its
atoms, as ASE's ``FrechetCellFilter`` / ``UnitCellFilter`` under an ASE optimiser do (see
:mod:`alchemi_integrators.cell_filter`): the cell's three rows of degrees of freedom take part in
the power, the mixing and the step cap like three more atoms, with the system's mean atomic mass,
and ``scalar_pressure`` (eV/Å³; a number, ``[B]`` tensor or field name) is the target pressure.
Its step needs the model's stress; the filter's coordinates (the atoms and the cell's rows) take
the same Warp step as atoms do without a filter. An ``fmax`` criterion of the
convergence hook then counts the filter's forces (atoms' and cell's), ASE's criterion: the hook
is given a copy that reads :data:`~alchemi_integrators.cell_filter.CELL_FILTER_FMAX` instead.

**Step cap.** ``maxstep`` (Å) bounds the displacement of each step. ``maxstep_scope="atom"`` (the
default) clamps each atom's displacement to ``maxstep``; ``"system"`` scales a system's whole
displacement so its norm over all atoms is at most ``maxstep``, which is what ASE's FIRE does (and
what reproduces its trajectories), but makes each atom's step shrink with the system's size.

Example:
    >>> from alchemi_core import registry
    >>> from alchemi_core.dynamics import ConvergenceHook
    >>> relax = registry.build("integrator:fire2", model=model, dt=2.0, n_steps=500,
    ...                        convergence_hook=ConvergenceHook.from_fmax(0.05))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from alchemi_core.errors import ConfigurationError
from alchemi_core.units import ACCELERATION
from alchemi_integrators import warp_kernels
from alchemi_integrators.base import Integrator
from alchemi_integrators.cell_filter import (
    CELL_DOF,
    CELL_FILTER_FMAX,
    CELL_REFERENCE,
    CELL_VELOCITY,
    CellFilter,
    attach_cell_filter,
)
from alchemi_integrators.parameters import ParameterValue

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: Per-system optimiser state (system-level batch fields, reset when a system enters the stage).
FIRE_DT = "fire_dt"
FIRE_ALPHA = "fire_alpha"
FIRE_POSITIVE_STEPS = "fire_positive_steps"
FIRE_STEPS = "fire_steps"

MAXSTEP_SCOPES = ("atom", "system")



class FilterRows(NamedTuple):
    """A cell filter's coordinates as ``[V + 3B, 3]`` rows (the atoms, then each system's three
    cell rows) for FIRE's Warp step, and views of their two parts."""

    x: torch.Tensor
    v: torch.Tensor
    f: torch.Tensor
    inv_mass: torch.Tensor
    system: torch.Tensor
    powers: torch.Tensor
    atom_powers: torch.Tensor
    cell_powers: torch.Tensor
    cell_system: torch.Tensor
    atom_steps: torch.Tensor
    cell_steps: torch.Tensor
    atom_velocities: torch.Tensor
    cell_velocities: torch.Tensor
    atom_forces: torch.Tensor
    cell_forces: torch.Tensor


class _FireBase(Integrator):
    """What FIRE and FIRE2 share: state fields, reductions, the per-atom update and the cap."""

    #: FIRE 2.0's rules (delay, minimum dt, half step back) instead of the original FIRE's.
    uses_fire2 = False

    _FIRE_PARAMETERS: tuple[tuple[str, dict[str, Any]], ...] = (
        ("dt_max", {"unit": "fs", "low": 0.0, "low_open": True}),
        ("maxstep", {"unit": "Å", "low": 0.0, "low_open": True}),
        ("f_inc", {"low": 1.0}),
        ("f_dec", {"low": 0.0, "low_open": True, "high": 1.0}),
        ("alpha_start", {"low": 0.0, "high": 1.0}),
        ("f_alpha", {"low": 0.0, "low_open": True, "high": 1.0}),
    )

    def __init__(
        self,
        model: Any,
        n_steps: int,
        dt: ParameterValue,
        *,
        maxstep_scope: str,
        cell_filter: str | None = None,
        scalar_pressure: ParameterValue | None = None,
        hydrostatic_strain: bool = False,
        constant_volume: bool = False,
        mask: Sequence[bool] | Sequence[Sequence[bool]] | torch.Tensor | None = None,
        cell_factor: float | None = None,
        **kwargs: Any,
    ) -> None:
        # The cell filter's options are parameters of the signature (not taken from **kwargs)
        # so that a workflow file's stage is checked against them like every other parameter.
        values = {name: kwargs.pop(name) for name, _ in self._FIRE_PARAMETERS}
        super().__init__(model, n_steps=n_steps, dt=dt, **kwargs)
        for name, rules in self._FIRE_PARAMETERS:
            self.declare(name, values[name], **rules)
        if maxstep_scope not in MAXSTEP_SCOPES:
            raise ConfigurationError(f"maxstep_scope must be one of {MAXSTEP_SCOPES}, got {maxstep_scope!r}")
        self.maxstep_scope = maxstep_scope
        self._check_step_bounds()
        #: The cell filter (None: the cell stays as it is).
        self.cell_filter: CellFilter | None = attach_cell_filter(
            self, cell_filter, scalar_pressure, hydrostatic_strain=hydrostatic_strain,
            constant_volume=constant_volume, mask=mask, cell_factor=cell_factor,
        )

    def _check_step_bounds(self) -> None:
        """``dt_min <= dt <= dt_max`` where the values are known now (numbers or tensors)."""
        who = type(self).__name__
        dt = _known_values(self.parameters["dt"])
        for name, below in (("dt_max", False), ("dt_min", True)):
            param = self.parameters.get(name)
            bound = None if param is None else _known_values(param)
            if dt is None or bound is None:
                continue
            wrong = (bound > dt) if below else (bound < dt)
            if bool(wrong.any()):
                relation = "larger" if below else "smaller"
                fix = "dt_min <= dt" if below else "dt_max >= dt (FIRE's usual choice is dt_max = 10 dt)"
                raise ConfigurationError(
                    f"{who}: {name} ({_show(bound)} fs) is {relation} than dt ({_show(dt)} fs), so the step "
                    f"could never stay within its bounds; pass {fix}"
                )

    # ------------------------------------------------------------------ state
    def create_state(self, batch: Batch) -> None:
        dtype = batch.positions.dtype
        self.ensure_field(batch, FIRE_DT, (), dtype, "system")
        self.ensure_field(batch, FIRE_ALPHA, (), dtype, "system")
        self.ensure_field(batch, FIRE_POSITIVE_STEPS, (), torch.int32, "system")
        self.ensure_field(batch, FIRE_STEPS, (), torch.int32, "system")
        if self.cell_filter is not None:
            for name in (CELL_REFERENCE, CELL_DOF, CELL_VELOCITY):
                self.ensure_field(batch, name, (3, 3), dtype, "system")
            self.ensure_field(batch, CELL_FILTER_FMAX, (), dtype, "system")

    def init_state(self, batch: Batch, entering: torch.Tensor) -> None:
        """Entering systems start at rest with dt, alpha and the counters reset."""
        dt, alpha = getattr(batch, FIRE_DT), getattr(batch, FIRE_ALPHA)
        dt.copy_(torch.where(entering, self.per_system("dt", batch), dt))
        alpha.copy_(torch.where(entering, self.per_system("alpha_start", batch), alpha))
        getattr(batch, FIRE_POSITIVE_STEPS).masked_fill_(entering, self._entry_positive_steps)
        getattr(batch, FIRE_STEPS).masked_fill_(entering, 0)
        v = batch.velocities
        v.masked_fill_(entering.index_select(0, batch.batch_idx).unsqueeze(-1), 0.0)
        if self.cell_filter is not None:
            self.cell_filter.reset(batch, entering)
            getattr(batch, CELL_FILTER_FMAX).masked_fill_(entering, float("inf"))

    #: FIRE marks "no velocity yet" with -1 (ASE skips the power test on its first step).
    _entry_positive_steps = 0
    #: FIRE's velocities are the minimiser's: systems leave it at rest (the engine zeroes them).
    velocities_are_physical = False

    @property
    def mask_values_in_step(self) -> bool:  # type: ignore[override]
        """The one value FIRE derives from the masks (``active``) is built on the device alone, so
        a captured step may rebuild it from masks it rewrote itself (``CoreTuning.masks_in_step``);
        with a cell filter, the engine keeps rewriting them on the host (not measured that way)."""
        return self.cell_filter is None

    @property
    def fmax_field(self) -> str | None:  # type: ignore[override]
        """With a cell filter, the filter's fmax (atoms and cell, ASE's criterion), which logs show."""
        return None if self.cell_filter is None else CELL_FILTER_FMAX

    # ------------------------------------------------------------------ the step
    def pre_update(self, batch: Batch) -> None:
        if self.cell_filter is None:
            warp_kernels.fire_pre(self, batch)
            return
        # The filter's coordinates (atoms, then three cell rows per system) take the same Warp
        # step from zero, so afterwards they hold the step, which the filter maps back.
        rows = self._filter_rows(batch)
        self._filter_forces(batch, rows.atom_forces, rows.cell_forces)
        cell_velocity = getattr(batch, CELL_VELOCITY).view(-1, 3)
        rows.atom_velocities.copy_(batch.velocities)
        rows.cell_velocities.copy_(cell_velocity)
        rows.x.zero_()
        warp_kernels.fire_pre(self, batch, rows)
        batch.velocities.copy_(rows.atom_velocities)
        cell_velocity.copy_(rows.cell_velocities)
        self.cell_filter.move(batch, rows.atom_steps, rows.cell_steps.view(-1, 3, 3), self.context.system_mask)

    def post_update(self, batch: Batch) -> None:
        # The whole step is in pre_update: it uses the forces of the current positions. With a
        # cell filter, the filter's fmax of the new positions is computed here, for the
        # convergence check that follows.
        if self.cell_filter is None:
            return
        dtype, dev = batch.positions.dtype, batch.device
        atom = self.work.get("filter_atom_forces", batch.num_nodes, batch.node_capacity, (3,), dtype, dev)
        cell = self.work.get("filter_cell_forces", batch.num_graphs, batch.system_capacity, (3, 3), dtype, dev)
        self._filter_forces(batch, atom, cell.view(-1, 3))
        self.cell_filter.fmax(batch, atom, cell, getattr(batch, CELL_FILTER_FMAX))

    # ------------------------------------------------------------------ cell filter
    def _filter_forces(self, batch: Batch, atom_out: torch.Tensor, cell_out: torch.Tensor) -> None:
        """Atom forces in the undeformed frame into ``atom_out`` ``[V, 3]`` and cell forces into
        ``cell_out`` ``[3B, 3]``, of the current positions, cell and stress.

        Computed afresh at every call, in pre_update and again in post_update: reusing the
        previous post_update's values behind a host-side test made a replayed CUDA graph part
        from the eager step, and the cost is a few small kernels."""
        assert self.cell_filter is not None
        _, cell_forces = self.cell_filter.forces(batch, self.per_system("scalar_pressure", batch), atom_out)
        cell_out.copy_(cell_forces.reshape(-1, 3))

    def _cell_inv_mass(self, batch: Batch) -> torch.Tensor:
        """``[B]`` acceleration per unit force of the cell rows: the system's mean atomic mass."""
        m = batch.atomic_masses
        total = torch.zeros(batch.num_graphs, dtype=m.dtype, device=m.device).index_add_(0, batch.batch_idx, m)
        mean = total / batch.node_counts.to(m.dtype).clamp(min=1)
        return (ACCELERATION / mean).to(batch.positions.dtype)

    def _filter_rows(self, batch: Batch) -> FilterRows:
        """The filter's coordinates as rows: buffers kept while the batch's systems stay."""

        def build() -> FilterRows:
            n, b = batch.num_nodes, batch.num_graphs
            dtype, dev = batch.positions.dtype, batch.device
            x, v, f, powers = (torch.empty(n + 3 * b, 3, dtype=dtype, device=dev) for _ in range(4))
            cell_system = torch.arange(b, device=dev).repeat_interleave(3)
            inv_mass = torch.cat([self.inv_mass.view(-1), self._cell_inv_mass(batch).repeat_interleave(3)])
            return FilterRows(x, v, f, inv_mass, torch.cat([batch.batch_idx, cell_system]), powers,
                              powers[:n], powers[n:], cell_system, x[:n], x[n:], v[:n], v[n:], f[:n], f[n:])

        return self.cached("filter_rows", batch, build, reads_fields=False, masks=False)

    def _state(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return (
            getattr(batch, FIRE_DT),
            getattr(batch, FIRE_ALPHA),
            getattr(batch, FIRE_POSITIVE_STEPS),
            getattr(batch, FIRE_STEPS),
        )

class FIRE(_FireBase):
    """FIRE as in ASE (see the module docstring).

    Args:
        model: Returns ``energy`` ``[B, 1]`` and ``forces`` ``[V, 3]``.
        n_steps: Most steps (each system stops when its convergence hook says so).
        dt: Initial time step in fs.
        dt_max: Largest time step in fs.
        maxstep: Largest displacement per step in Å (see ``maxstep_scope``).
        n_min: Positive-power steps before dt may grow.
        f_inc: dt growth factor (>= 1).
        f_dec: dt cut factor (0 < f_dec <= 1).
        alpha_start: Initial mixing factor a.
        f_alpha: Mixing decay factor.
        maxstep_scope: ``"atom"`` or ``"system"`` (ASE's).
        **kwargs: The cell filter's options (``cell_filter``, ``scalar_pressure``,
            ``hydrostatic_strain``, ``constant_volume``, ``mask``, ``cell_factor``: see the module
            docstring and :class:`~alchemi_integrators.cell_filter.CellFilter`) and
            ``BaseDynamics``'s arguments (``convergence_hook``, ...).

    Every parameter except ``maxstep_scope`` is a number, a ``[B]`` tensor or a field name.
    """

    _FIRE_PARAMETERS = (*_FireBase._FIRE_PARAMETERS, ("n_min", {"low": 0.0}))
    _entry_positive_steps = -1

    def __init__(
        self,
        model: Any,
        n_steps: int = 1000,
        dt: ParameterValue = 1.0,
        dt_max: ParameterValue = 10.0,
        maxstep: ParameterValue = 0.2,
        n_min: ParameterValue = 5,
        f_inc: ParameterValue = 1.1,
        f_dec: ParameterValue = 0.5,
        alpha_start: ParameterValue = 0.1,
        f_alpha: ParameterValue = 0.99,
        *,
        maxstep_scope: str = "atom",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            model, n_steps, dt, maxstep_scope=maxstep_scope, dt_max=dt_max, maxstep=maxstep, n_min=n_min,
            f_inc=f_inc, f_dec=f_dec, alpha_start=alpha_start, f_alpha=f_alpha, **kwargs,
        )

class FIRE2(_FireBase):
    """FIRE 2.0 (see the module docstring); defaults are the paper's recommended values (LAMMPS's too).

    Args:
        model: Returns ``energy`` ``[B, 1]`` and ``forces`` ``[V, 3]``.
        n_steps: Most steps (each system stops when its convergence hook says so).
        dt: Initial time step in fs.
        dt_max: Largest time step in fs (the paper: 10 dt).
        dt_min: Smallest time step a cut may reach, in fs (the paper: 0.02 dt).
        maxstep: Largest displacement per step in Å (see ``maxstep_scope``).
        n_delay: Positive-power steps before dt may grow, and length of the initial delay.
        f_inc: dt growth factor.
        f_dec: dt cut factor.
        alpha_start: Initial mixing factor a.
        f_alpha: Mixing decay factor.
        initial_delay: No dt cut during a system's first ``n_delay`` steps in the stage.
        half_step_back: Move back half a step when the power turns negative.
        maxstep_scope: ``"atom"`` or ``"system"``.
        **kwargs: The cell filter's options (``cell_filter``, ``scalar_pressure``,
            ``hydrostatic_strain``, ``constant_volume``, ``mask``, ``cell_factor``: see the module
            docstring and :class:`~alchemi_integrators.cell_filter.CellFilter`) and
            ``BaseDynamics``'s arguments (``convergence_hook``, ...).
    """

    _FIRE_PARAMETERS = (
        *_FireBase._FIRE_PARAMETERS,
        ("dt_min", {"unit": "fs", "low": 0.0}),
        ("n_delay", {"low": 0.0}),
    )

    uses_fire2 = True

    def __init__(
        self,
        model: Any,
        n_steps: int = 1000,
        dt: ParameterValue = 1.0,
        dt_max: ParameterValue = 10.0,
        dt_min: ParameterValue = 0.02,
        maxstep: ParameterValue = 0.1,
        n_delay: ParameterValue = 20,
        f_inc: ParameterValue = 1.1,
        f_dec: ParameterValue = 0.5,
        alpha_start: ParameterValue = 0.25,
        f_alpha: ParameterValue = 0.99,
        *,
        initial_delay: bool = True,
        half_step_back: bool = True,
        maxstep_scope: str = "atom",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            model, n_steps, dt, maxstep_scope=maxstep_scope, dt_max=dt_max, dt_min=dt_min, maxstep=maxstep,
            n_delay=n_delay, f_inc=f_inc, f_dec=f_dec, alpha_start=alpha_start, f_alpha=f_alpha, **kwargs,
        )
        self.initial_delay = bool(initial_delay)
        self.half_step_back = bool(half_step_back)

def _known_values(param: Any) -> torch.Tensor | None:
    """A parameter's values as a float64 tensor, or None when they come from a field."""
    if param.scalar is not None:
        return torch.tensor([float(param.scalar)], dtype=torch.float64)
    if param.tensor is not None:
        return param.tensor.detach().to("cpu", torch.float64).reshape(-1)
    return None


def _show(values: torch.Tensor) -> str:
    return f"{values.item():g}" if values.numel() == 1 else f"{values.tolist()[:4]}"
