"""``NaNDetectorHook``: stop a run the moment NaN or infinite values appear, naming where.

Every ``frequency`` steps the hook tests the named fields (atom, edge or system level) of its
stage's systems on the device and reads back one flag; only when it is set does it read the
details and raise :class:`~alchemi_hooks.errors.NonFiniteError` naming each affected system
(``system_id``), field and atom (numbered within its system).

Example:
    >>> from alchemi_core.dynamics import DemoDynamics
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> from alchemi_hooks.nonfinite import NaNDetectorHook
    >>> md = DemoDynamics(model=DemoModelWrapper(), n_steps=100, dt=0.5,
    ...                   hooks=[NaNDetectorHook(frequency=10, fields=("positions", "forces", "energy"))])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from alchemi_core.data.fields import Level
from alchemi_core.dynamics.hook import Hook
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.errors import ConfigurationError
from alchemi_hooks.errors import NonFiniteError
from alchemi_hooks.requirements import require_fields
from alchemi_hooks.scope import Scope

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: Systems described in full in an error message.
_LISTED = 10


class NaNDetectorHook(Hook):
    """Raise ``NonFiniteError`` when a named field holds NaN or inf in the stage's systems.

    Args:
        frequency: Check every N-th step.
        fields: Batch fields to check.
        stage: Check at another hook point than ``AFTER_STEP`` (``AFTER_COMPUTE`` catches a model
            that returns NaN before the integrator spreads it).

    Raises:
        ConfigurationError: No fields, or (when a run starts) a field the batch lacks.
    """

    stage = DynamicsStage.AFTER_STEP

    def __init__(
        self,
        frequency: int = 1,
        fields: Sequence[str] = ("positions", "forces"),
        stage: DynamicsStage | None = None,
    ) -> None:
        super().__init__(frequency=frequency, stage=stage)
        if isinstance(fields, str):
            fields = (fields,)
        self.fields = tuple(fields)
        if not self.fields:
            raise ConfigurationError("NaNDetectorHook needs at least one field to check")
        self._scope = Scope()

    def on_run_start(self, batch: Batch, dynamics: Any) -> None:
        require_fields(batch, self.fields, "NaNDetectorHook", "Pass fields= with names from that list.")

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        bad_systems = torch.zeros(batch.num_graphs, dtype=torch.int32, device=batch.device)
        for name in self.fields:
            bad_rows = self._bad_rows(batch, name)
            segment = self._segment_of(batch, name)
            if segment is None:
                bad_systems += bad_rows
            else:
                bad_systems.index_add_(0, segment, bad_rows.to(torch.int32))
        systems = self._scope.systems(batch, dynamics)
        if systems is not None:
            bad_systems.mul_(systems)
        if bool(bad_systems.any()):  # the hook's one read-back
            raise self._describe(batch, dynamics, bad_systems > 0)

    @staticmethod
    def _bad_rows(batch: Batch, name: str) -> torch.Tensor:
        value = getattr(batch, name)
        if not value.dtype.is_floating_point and not value.dtype.is_complex:
            return torch.zeros(value.shape[0], dtype=torch.int32, device=value.device)
        return (~torch.isfinite(value)).reshape(value.shape[0], -1).any(dim=1).to(torch.int32)

    @staticmethod
    def _segment_of(batch: Batch, name: str) -> torch.Tensor | None:
        level = batch.level_of(name)
        if level is Level.NODE:
            return batch.batch_idx
        if level is Level.EDGE:
            return batch.edge_batch_idx
        return None

    def _describe(self, batch: Batch, dynamics: Any, bad: torch.Tensor) -> NonFiniteError:
        rows = np.nonzero(bad.cpu().numpy())[0]
        ids = batch.system_id.cpu().numpy() if "system_id" in batch else np.arange(batch.num_graphs)
        node_start = np.concatenate(([0], np.cumsum(batch.num_nodes_per_system)))
        edge_start = np.concatenate(([0], np.cumsum(batch.num_edges_per_system)))
        per_field = {name: self._bad_rows(batch, name).cpu().numpy().astype(bool) for name in self.fields}
        atoms: dict[int, dict[str, list[int]]] = {}
        parts: list[str] = []
        for row in rows:
            sid = int(ids[row])
            found: dict[str, list[int]] = {}
            for name, flags in per_field.items():
                level = batch.level_of(name)
                if level is Level.SYSTEM:
                    if flags[row]:
                        found[name] = []
                    continue
                start = node_start if level is Level.NODE else edge_start
                local = np.nonzero(flags[start[row] : start[row + 1]])[0]
                if len(local):
                    found[name] = local.tolist()
            atoms[sid] = found
            if len(parts) < _LISTED:
                what = "; ".join(_where(name, batch.level_of(name), idx) for name, idx in found.items())
                parts.append(f"system_id {sid}: {what}")
        more = f" (and {len(rows) - _LISTED} more systems)" if len(rows) > _LISTED else ""
        step = int(getattr(dynamics, "step_count", 0))
        stage = getattr(dynamics, "name", type(dynamics).__name__)
        message = (
            f"NaNDetectorHook: non-finite values at step {step} in {len(rows)} system(s) of stage "
            f"{stage!r}: " + " | ".join(parts) + more + ". Atoms are numbered within each system. "
            "Common causes: a time step too large for the structure (lower dt), overlapping atoms "
            "in a starting structure, or a model evaluated outside its range (MaxForceClampHook helps "
            "with the first steps)"
        )
        return NonFiniteError(message, step=step, system_ids=[int(ids[r]) for r in rows], atoms=atoms)

    def __repr__(self) -> str:
        return f"NaNDetectorHook(fields={self.fields}, frequency={self.frequency})"


def _where(name: str, level: Level, rows: list[int]) -> str:
    """``"forces at atoms [0, 4]"``; a system-level field is named alone."""
    if level is Level.SYSTEM:
        return name
    shown = f"{rows[:_LISTED]}{'...' if len(rows) > _LISTED else ''}"
    return f"{name} at {'atoms' if level is Level.NODE else 'edges'} {shown}"
