"""``SnapshotHook`` and ``ConvergedSnapshotHook``: write systems to a ``DataSink`` during a run.

``SnapshotHook(sink, frequency)`` writes the systems of its stage every N steps (a trajectory);
``ConvergedSnapshotHook(sink)`` writes, at each convergence check, the systems that just
converged. Any ``DataSink`` works; a full sink raises its ``CapacityError``.

Example:
    >>> from alchemi_core.dynamics import DemoDynamics, HostMemory
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> from alchemi_hooks.snapshot import SnapshotHook
    >>> trajectory = HostMemory(capacity=10_000)
    >>> md = DemoDynamics(model=DemoModelWrapper(), n_steps=100, dt=0.5,
    ...                   hooks=[SnapshotHook(sink=trajectory, frequency=10)])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from alchemi_core.dynamics.hook import Hook
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.errors import ConfigurationError
from alchemi_hooks.scope import Scope

if TYPE_CHECKING:
    from alchemi_core.data import Batch
    from alchemi_core.dynamics.sinks import DataSink


def _check_sink(owner: str, sink: Any) -> None:
    if not callable(getattr(sink, "write", None)):
        raise ConfigurationError(
            f"{owner}: sink must be a DataSink (with write(batch, mask)), got {type(sink).__name__}"
        )


class SnapshotHook(Hook):
    """Write the stage's systems to ``sink`` every ``frequency`` steps.

    Args:
        sink: Where snapshots go.
        frequency: Steps between snapshots.
        stage: Snapshot at another hook point than ``AFTER_STEP``.
    """

    stage = DynamicsStage.AFTER_STEP

    def __init__(self, sink: DataSink, frequency: int = 1, stage: DynamicsStage | None = None) -> None:
        super().__init__(frequency=frequency, stage=stage)
        _check_sink("SnapshotHook", sink)
        self.sink = sink
        self._scope = Scope()

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        self.sink.write(batch, self._scope.systems(batch, dynamics))

    def __repr__(self) -> str:
        return f"SnapshotHook({self.sink!r}, frequency={self.frequency})"


class ConvergedSnapshotHook(Hook):
    """Write the systems that converged at this check to ``sink`` (they carry their new status).

    Args:
        sink: Where converged systems go.
        frequency: Act on every N-th convergence check step.
    """

    stage = DynamicsStage.ON_CONVERGE

    def __init__(self, sink: DataSink, frequency: int = 1) -> None:
        super().__init__(frequency=frequency)
        _check_sink("ConvergedSnapshotHook", sink)
        self.sink = sink

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        converged = getattr(dynamics, "converged_mask", None)
        # A check step may read back; skipping empty writes keeps stores free of empty records.
        if converged is None or not bool(converged.any()):
            return
        self.sink.write(batch, converged)

    def __repr__(self) -> str:
        return f"ConvergedSnapshotHook({self.sink!r})"
