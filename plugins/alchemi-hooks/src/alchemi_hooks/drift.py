"""``EnergyDriftMonitorHook``: watch each system's total energy for drift.

Every ``frequency`` steps the hook computes ``|E - E_0| / N_atoms`` of the total energy
``E = potential + kinetic (+ extra_energy fields)`` on the device and reads back one flag; past
``threshold`` (eV/atom) it warns (:class:`~alchemi_hooks.errors.EnergyDriftWarning`, once per
system) or raises (:class:`~alchemi_hooks.errors.EnergyDriftError`), naming the systems.
``E_0`` is taken at the hook's first call after a system enters its stage, and follows its
system by ``system_id``. Under a thermostat pass the bath's energy field in ``extra_energy``.

Example:
    >>> from alchemi_core.dynamics import DemoDynamics
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> from alchemi_hooks.drift import EnergyDriftMonitorHook
    >>> md = DemoDynamics(model=DemoModelWrapper(), n_steps=1000, dt=0.5,
    ...                   hooks=[EnergyDriftMonitorHook(threshold=1e-3, frequency=100, action="raise")])
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from alchemi_core.dynamics.hook import Hook
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.errors import ConfigurationError
from alchemi_hooks.errors import EnergyDriftError, EnergyDriftWarning
from alchemi_hooks.observables import kinetic_energy
from alchemi_hooks.requirements import require_fields
from alchemi_hooks.scope import Scope

if TYPE_CHECKING:
    from alchemi_core.data import Batch

ACTIONS = ("warn", "raise")


def follow_by_id(
    old_ids: torch.Tensor, old_values: torch.Tensor, old_valid: torch.Tensor, new_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-system values carried from an old row order to a new one by ``system_id``, on the
    device (no read-back).

    Returns:
        ``(values, valid)`` for the new rows; ``valid`` is False where the id was not in the old
        rows (or its value was not valid).
    """
    if old_ids.numel() == 0 or new_ids.numel() == 0:
        return torch.zeros_like(new_ids, dtype=old_values.dtype), torch.zeros_like(new_ids, dtype=torch.bool)
    sorted_ids, order = torch.sort(old_ids)
    at = torch.searchsorted(sorted_ids, new_ids).clamp_(max=old_ids.numel() - 1)
    source = order.index_select(0, at)
    valid = (old_ids.index_select(0, source) == new_ids) & old_valid.index_select(0, source)
    return old_values.index_select(0, source), valid


class EnergyDriftMonitorHook(Hook):
    """Warn or raise when a system's total energy per atom drifts past ``threshold`` (eV/atom).

    Args:
        threshold: Largest allowed ``|E - E_0| / N_atoms`` in eV.
        frequency: Check every N-th step.
        action: ``"warn"`` (once per system) or ``"raise"``.
        extra_energy: System-level batch fields (eV) added to the total, e.g. a thermostat's
            bath energy.

    Attributes:
        flagged: ``{system_id: drift per atom}`` for every system that passed the threshold,
            at the check that first found it.

    Raises:
        ConfigurationError: A threshold that is not a positive number, or an unknown action.
    """

    stage = DynamicsStage.AFTER_STEP

    def __init__(
        self,
        threshold: float = 0.01,
        frequency: int = 100,
        action: str = "warn",
        extra_energy: Sequence[str] = (),
    ) -> None:
        super().__init__(frequency=frequency)
        limit = float(threshold)
        if not (limit > 0 and math.isfinite(limit)):
            raise ConfigurationError(f"EnergyDriftMonitorHook: threshold must be a positive eV/atom, got {threshold!r}")
        if action not in ACTIONS:
            raise ConfigurationError(f"EnergyDriftMonitorHook: action must be one of {ACTIONS}, got {action!r}")
        self.threshold = limit
        self.action = action
        self.extra_energy = (extra_energy,) if isinstance(extra_energy, str) else tuple(extra_energy)
        self.flagged: dict[int, float] = {}
        self._scope = Scope()
        self._reset()

    def _reset(self) -> None:
        self._reference: torch.Tensor | None = None  # [B] float64, E_0 per row
        self._valid: torch.Tensor | None = None  # [B] bool, row has an E_0 in this stage
        self._ids: torch.Tensor | None = None  # [B] system_id the row's E_0 belongs to
        self._batch: Batch | None = None
        self._version = -1

    def on_run_start(self, batch: Batch, dynamics: Any) -> None:
        require_fields(batch, self.extra_energy, "EnergyDriftMonitorHook", "Fix extra_energy=")
        self._reset()

    def on_run_end(self, batch: Batch, dynamics: Any) -> None:
        self._reset()

    def total_energy(self, batch: Batch) -> torch.Tensor:
        """``[B]`` float64 potential + kinetic (+ extra) energy per system, eV."""
        total = batch.energy.reshape(-1).to(torch.float64) + kinetic_energy(batch).to(torch.float64)
        for key in self.extra_energy:
            total += getattr(batch, key).reshape(batch.num_graphs, -1).sum(dim=1).to(torch.float64)
        return total

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        drift, exceeded = self._update(batch, dynamics)
        if bool(exceeded.any()):  # the hook's one read-back
            self._report(batch, dynamics, drift, exceeded)

    def _update(self, batch: Batch, dynamics: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Set missing references, return ``(drift per atom, exceeded)`` per system."""
        energy = self.total_energy(batch)
        self._follow(batch)
        assert self._reference is not None and self._valid is not None
        systems = self._scope.systems(batch, dynamics)
        if systems is None:
            systems = torch.ones_like(self._valid)
        entering = systems & ~self._valid
        self._reference = torch.where(entering, energy, self._reference)
        # Systems outside the stage drop their reference: they get a fresh one when they enter.
        self._valid = systems.clone()
        atoms = batch.node_counts.to(torch.float64).clamp_(min=1.0)
        drift = (energy - self._reference).abs_().div_(atoms)
        # NaN energies count as exceeding: ~(drift <= threshold) is True for NaN.
        exceeded = systems & ~(drift <= self.threshold)
        return drift, exceeded

    def _follow(self, batch: Batch) -> None:
        """Keep references aligned with rows when the batch's composition changed."""
        if self._batch is batch and self._version == batch.version:
            return
        ids = batch.system_id.clone()
        if self._reference is None or self._ids is None or self._valid is None:
            self._reference = torch.zeros(batch.num_graphs, dtype=torch.float64, device=batch.device)
            self._valid = torch.zeros(batch.num_graphs, dtype=torch.bool, device=batch.device)
        else:
            self._reference, self._valid = follow_by_id(self._ids, self._reference, self._valid, ids)
        self._ids, self._batch, self._version = ids, batch, batch.version

    def _report(self, batch: Batch, dynamics: Any, drift: torch.Tensor, exceeded: torch.Tensor) -> None:
        rows = np.nonzero(exceeded.cpu().numpy())[0]
        ids = batch.system_id.cpu().numpy()[rows]
        values = drift.cpu().numpy()[rows]
        drifts = {int(i): float(v) for i, v in zip(ids, values, strict=True)}
        step = int(getattr(dynamics, "step_count", 0))
        stage = getattr(dynamics, "name", type(dynamics).__name__)
        new = {i: v for i, v in drifts.items() if i not in self.flagged}
        self.flagged.update(new)
        shown = ", ".join(f"system_id {i}: {v:.3g} eV/atom" for i, v in list(drifts.items())[:10])
        more = f" (and {len(drifts) - 10} more)" if len(drifts) > 10 else ""
        message = (
            f"EnergyDriftMonitorHook: total energy drifted by more than {self.threshold:g} eV/atom at "
            f"step {step} in stage {stage!r}: {shown}{more}. Lower the time step (dt = "
            f"{getattr(dynamics, 'dt', '?')} fs), check the model's forces are the energy's "
            "gradient, or raise the threshold"
        )
        if self.action == "raise":
            raise EnergyDriftError(message, step=step, drifts=drifts)
        if new:
            warnings.warn(message, EnergyDriftWarning, stacklevel=2)

    def __repr__(self) -> str:
        return (
            f"EnergyDriftMonitorHook(threshold={self.threshold}, frequency={self.frequency}, "
            f"action={self.action!r})"
        )
