"""Errors and warnings raised by alchemi-hooks (errors derive from ``AlchemiError``).

Example:
    >>> from alchemi_core.errors import AlchemiError
    >>> from alchemi_hooks.errors import NonFiniteError
    >>> issubclass(NonFiniteError, AlchemiError)
    True
"""

from __future__ import annotations

from alchemi_core.errors import AlchemiError


class NonFiniteError(AlchemiError, FloatingPointError):
    """NaN or infinite values appeared during a run (raised by ``NaNDetectorHook``).

    Attributes:
        step: The step index at which they were found.
        system_ids: ``system_id`` of every affected system, in batch order.
        atoms: Per ``system_id``, per field, the affected atom indices within the system
            (an empty list for a system-level field).
    """

    def __init__(self, message: str, step: int, system_ids: list[int], atoms: dict[int, dict[str, list[int]]]) -> None:
        super().__init__(message)
        self.step = step
        self.system_ids = system_ids
        self.atoms = atoms


class EnergyDriftError(AlchemiError, RuntimeError):
    """A system's total energy drifted past the threshold (``EnergyDriftMonitorHook``, action "raise").

    Attributes:
        step: The step index of the check that found it.
        drifts: Per ``system_id``, ``|E - E_0|`` per atom in eV.
    """

    def __init__(self, message: str, step: int, drifts: dict[int, float]) -> None:
        super().__init__(message)
        self.step = step
        self.drifts = drifts


class EnergyDriftWarning(RuntimeWarning):
    """A system's total energy drifted past the threshold (``EnergyDriftMonitorHook``, action "warn")."""


class HookWorkerError(AlchemiError, RuntimeError):
    """A hook's background work (writing a log, say) failed; the message names the hook and the cause."""
