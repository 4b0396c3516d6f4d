"""``HookPart``: one hook point of a hook that acts at several (listed in the hook's ``parts``).

The engine schedules each part at its own stage and frequency and calls it with the usual
``(batch, dynamics)``; the outer hook keeps the state and the lifecycle methods.

Example:
    >>> from alchemi_core.dynamics import DynamicsStage
    >>> from alchemi_hooks.parts import HookPart
    >>> part = HookPart(DynamicsStage.AFTER_COMPUTE, lambda batch, dynamics: None)
    >>> part.stage.name, part.frequency
    ('AFTER_COMPUTE', 1)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from alchemi_core.dynamics.stage import DynamicsStage

if TYPE_CHECKING:
    from alchemi_core.data import Batch


class HookPart:
    """Calls ``action(batch, dynamics)`` at ``stage`` every ``frequency`` steps."""

    __slots__ = ("stage", "frequency", "action")

    def __init__(self, stage: DynamicsStage, action: Callable[[Batch, Any], None], frequency: int = 1) -> None:
        self.stage = DynamicsStage(stage)
        self.frequency = int(frequency)
        self.action = action

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        self.action(batch, dynamics)

    def __repr__(self) -> str:
        return f"HookPart({self.stage.name}, {getattr(self.action, '__qualname__', self.action)!r})"
