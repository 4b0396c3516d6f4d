"""``LoggingHook``: one row per system every N steps, written off the step path.

Each row holds ``step, system_id, status, time, energy, kinetic_energy, total_energy, fmax,
temperature`` (fs, eV, eV/Å, K) of a system of the hook's stage: ``time`` is its steps in the
stage times ``dt``, the temperature counts the degrees of freedom the stage's thermostat uses
(:func:`alchemi_hooks.observables.temperature`), and ``fmax`` is the stage's (under a cell
filter it counts the cell's forces, as convergence does: ``BaseDynamics.fmax_field``). The row for
step ``k`` is the state at the end of step ``k``, when ``k`` is a multiple of ``frequency``.

Periodic systems can add ``volume, pressure, stress_xx, stress_yy, stress_zz, stress_yz,
stress_xz, stress_xy`` (Å³, eV/Å³; ``value / units.GPA`` is GPa): the instantaneous pressure
``2 K / (3 V) - tr(stress) / 3`` (:func:`alchemi_core.dynamics.pressure.pressure`, the barostats'
formula) and the model's stress in Voigt order with ASE's sign. ``pressure=True`` logs them and
makes the run ask the model for stress (the hook's ``needs_stress``; a molecule is then refused);
the default logs them when the stage computes stress anyway (NPT, a cell filter).

The values are computed on the device and written by a background thread
(:mod:`alchemi_hooks.host_transfer`), so the step never waits for the GPU or the disk. The first
run of a hook truncates ``log_path`` and writes the header; later runs append. ``writer`` (any
callable) receives one dict of numpy columns per logged step, on that thread.

Example:
    >>> from alchemi_core.dynamics import DemoDynamics
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> from alchemi_hooks.logger import LoggingHook
    >>> md = DemoDynamics(model=DemoModelWrapper(), n_steps=1000, dt=0.5,
    ...                   hooks=[LoggingHook(backend="csv", log_path="md_log.csv", frequency=100)])
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import torch

from alchemi_core.dynamics.hook import Hook
from alchemi_core.dynamics.pressure import cell_volume
from alchemi_core.dynamics.pressure import pressure as instantaneous_pressure
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.errors import ConfigurationError
from alchemi_hooks.host_transfer import HostTransfer
from alchemi_hooks.observables import com_fixed, kinetic_energy, max_force, temperature
from alchemi_hooks.scope import Scope

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: The columns of every row, in file order.
COLUMNS = ("step", "system_id", "status", "time", "energy", "kinetic_energy", "total_energy", "fmax", "temperature")
#: The columns periodic systems add with ``pressure`` (stress in Voigt order, as ASE's).
PRESSURE_COLUMNS = ("volume", "pressure", "stress_xx", "stress_yy", "stress_zz", "stress_yz", "stress_xz", "stress_xy")
BACKENDS = ("csv",)
#: Written when neither ``log_path`` nor ``writer`` is given.
DEFAULT_LOG_PATH = "dynamics_log.csv"

# Device table layout: the stage mask first, then COLUMNS[1:] (step is known on the host).
_IN_STAGE, _SYSTEM_ID, _STATUS, _TIME, _ENERGY, _KINETIC, _TOTAL, _FMAX, _TEMPERATURE = range(9)
_VOLUME, _PRESSURE, _STRESS = 9, 10, 11
_VOIGT = ((0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1))


class LoggingHook(Hook):
    """Log per-system step, id, status, time, energies, fmax and temperature (see the module docstring).

    Args:
        backend: ``"csv"``, the file backend.
        log_path: The CSV file (default ``dynamics_log.csv`` when no ``writer`` is given).
        frequency: Log every N-th step.
        writer: ``writer(columns: dict[str, np.ndarray])`` called per logged step on a
            background thread.
        stage: Log at another hook point than ``AFTER_STEP``.
        pressure: Log volume, pressure and stress (:data:`PRESSURE_COLUMNS`): True asks the model
            for stress (periodic systems only), False never logs them, None (default) logs them
            when the stage computes stress anyway (NPT, a cell filter) and the systems are periodic.

    Raises:
        ConfigurationError: An unknown backend, a writer that is not callable, or
            ``pressure=True`` on systems without a cell.
    """

    stage = DynamicsStage.AFTER_STEP

    def __init__(
        self,
        backend: str = "csv",
        log_path: str | os.PathLike[str] | None = None,
        frequency: int = 100,
        writer: Callable[[dict[str, np.ndarray]], Any] | None = None,
        stage: DynamicsStage | None = None,
        pressure: bool | None = None,
    ) -> None:
        super().__init__(frequency=frequency, stage=stage)
        if backend not in BACKENDS:
            raise ConfigurationError(
                f"LoggingHook: backend {backend!r} is not available; the backends are {BACKENDS}. "
                "For anything else pass writer=callable, which receives one dict of columns per logged step"
            )
        if writer is not None and not callable(writer):
            raise ConfigurationError(f"LoggingHook: writer must be callable, got {type(writer).__name__}")
        self.backend = backend
        self.pressure = pressure
        #: Read by the engine: the run asks the model for stress when a hook needs it.
        self.needs_stress = pressure is True
        #: The columns this hook writes: COLUMNS, then PRESSURE_COLUMNS where it logs pressure.
        self.columns: tuple[str, ...] = COLUMNS
        self.writer = writer
        if log_path is None and writer is None:
            log_path = DEFAULT_LOG_PATH
        self.log_path: Path | None = Path(log_path) if log_path is not None else None
        self._scope = Scope()
        self._transfer: HostTransfer | None = None
        self._file: IO[str] | None = None
        self._opened_before = False
        self._float_format = "%.9g"

    def on_run_start(self, batch: Batch, dynamics: Any) -> None:
        self._open(batch, dynamics)

    def on_run_end(self, batch: Batch, dynamics: Any) -> None:
        self.close()

    def close(self) -> None:
        """Write everything logged so far and close the file (runs call it at their end; call it
        yourself after stepping by hand with ``dynamics.step``)."""
        transfer, self._transfer = self._transfer, None
        try:
            if transfer is not None:
                transfer.close()
        finally:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _open(self, batch: Batch, dynamics: Any) -> None:
        self.close()
        periodic = "cell" in batch
        if self.pressure and not periodic:
            raise ConfigurationError(
                "LoggingHook(pressure=True): the systems have no cell; pressure needs periodic systems "
                "(give them a cell, or drop pressure=True)"
            )
        stressed = self.pressure if self.pressure is not None else bool(getattr(dynamics, "needs_stress", False))
        self.columns = COLUMNS + PRESSURE_COLUMNS if stressed and periodic else COLUMNS
        # Enough digits to read back the value the batch held.
        self._float_format = "%.17g" if batch.positions.dtype == torch.float64 else "%.9g"
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            append = self._opened_before
            self._file = open(self.log_path, "a" if append else "w", encoding="utf-8", newline="")
            if not append:
                self._file.write(",".join(self.columns) + "\n")
            self._opened_before = True
        self._transfer = HostTransfer(self._consume, name="LoggingHook")

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        if self._transfer is None:
            self._open(batch, dynamics)
        assert self._transfer is not None
        self._transfer.submit(self._table(batch, dynamics), meta=int(dynamics.step_count))

    def _table(self, batch: Batch, dynamics: Any) -> torch.Tensor:
        """``[B, C]`` float64 on the device: in-stage flag, then the columns after ``step``."""
        table = torch.empty(batch.num_graphs, len(self.columns), dtype=torch.float64, device=batch.device)
        systems = self._scope.systems(batch, dynamics)
        if systems is None:
            table[:, _IN_STAGE] = 1.0
        else:
            table[:, _IN_STAGE] = systems
        table[:, _SYSTEM_ID] = batch.system_id
        table[:, _STATUS] = batch.status
        # At AFTER_STEP the engine has counted this step in stage_steps already.
        if "stage_steps" in batch:
            steps = batch.stage_steps
        else:
            steps = torch.full_like(batch.system_id, dynamics.step_count + 1)
        table[:, _TIME] = steps * _dt(batch, dynamics)
        table[:, _ENERGY] = batch.energy.reshape(-1)
        ke = kinetic_energy(batch)
        table[:, _KINETIC] = ke
        table[:, _TOTAL] = table[:, _ENERGY] + table[:, _KINETIC]
        table[:, _FMAX] = _fmax(batch, dynamics)
        table[:, _TEMPERATURE] = temperature(batch, ke, com_fixed=com_fixed(dynamics))
        if len(self.columns) > len(COLUMNS):
            table[:, _VOLUME] = cell_volume(batch)
            table[:, _PRESSURE] = instantaneous_pressure(batch)
            stress = batch.stress.reshape(-1, 3, 3)
            for k, (i, j) in enumerate(_VOIGT):
                table[:, _STRESS + k] = stress[:, i, j]
        return table

    def _consume(self, table: np.ndarray, step: int) -> None:
        rows = table[table[:, _IN_STAGE] > 0.5]
        columns = {
            "step": np.full(len(rows), step, dtype=np.int64),
            "system_id": rows[:, _SYSTEM_ID].astype(np.int64),
            "status": rows[:, _STATUS].astype(np.int64),
            "time": rows[:, _TIME].copy(),
            "energy": rows[:, _ENERGY].copy(),
            "kinetic_energy": rows[:, _KINETIC].copy(),
            "total_energy": rows[:, _TOTAL].copy(),
            "fmax": rows[:, _FMAX].copy(),
            "temperature": rows[:, _TEMPERATURE].copy(),
        }
        for k, name in enumerate(self.columns[len(COLUMNS):], start=len(COLUMNS)):
            columns[name] = rows[:, k].copy()
        if self._file is not None:
            # Python scalars from tolist() format twice as fast as numpy scalars: this runs on
            # a thread that shares the interpreter lock with the stepping loop.
            row = "%d,%d,%d," + ",".join([self._float_format] * (len(self.columns) - 3)) + "\n"
            lines = [row % r for r in zip(*(columns[c].tolist() for c in self.columns), strict=True)]
            self._file.write("".join(lines))
            # Flushed per step so a run that dies keeps its log up to the last logged step.
            self._file.flush()
        if self.writer is not None:
            self.writer(columns)

    def __repr__(self) -> str:
        where = str(self.log_path) if self.log_path is not None else "writer"
        return f"LoggingHook({where!r}, frequency={self.frequency})"


def _fmax(batch: Batch, dynamics: Any) -> torch.Tensor:
    """``[B]`` fmax as the stage counts it: its ``fmax_field`` for its own systems (a cell filter's,
    which counts the cell's forces), else the largest atomic force."""
    atoms = max_force(batch)
    field = getattr(dynamics, "fmax_field", None)
    if field is None or field not in batch:
        return atoms
    mask = dynamics.context.system_mask
    own = getattr(batch, field).to(atoms.dtype)
    return own if mask is None else torch.where(mask, own, atoms)


def _dt(batch: Batch, dynamics: Any) -> torch.Tensor | float:
    """The stage's time step per system (fs)."""
    per_system = getattr(dynamics, "per_system", None)
    if callable(per_system) and "dt" in getattr(dynamics, "parameters", {}):
        return per_system("dt", batch).to(torch.float64)
    dt = getattr(dynamics, "dt", 1.0)
    return dt.to(torch.float64) if isinstance(dt, torch.Tensor) else float(dt)
