"""``HookPart``: one hook point of a hook that acts at several (listed in the hook's ``parts``).

The engine schedules each part at its own stage and frequency; the outer hook keeps the state
and the lifecycle methods. A part holds a bound method of a hook weakly (the hook holds its
parts: a strong reference back would be a cycle); any other callable is held as given.

Example:
    >>> from alchemi_core.dynamics import DynamicsStage
    >>> from alchemi_hooks.parts import HookPart
    >>> part = HookPart(DynamicsStage.AFTER_COMPUTE, lambda batch, dynamics: None)
    >>> part.stage.name, part.frequency
    ('AFTER_COMPUTE', 1)
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from alchemi_core.dynamics.hook import Hook
from alchemi_core.dynamics.stage import DynamicsStage

if TYPE_CHECKING:
    from alchemi_core.data import Batch


class HookPart:
    """Calls ``action(batch, dynamics)`` at ``stage`` every ``frequency`` steps."""

    __slots__ = ("stage", "frequency", "_action")

    def __init__(self, stage: DynamicsStage, action: Callable[[Batch, Any], None], frequency: int = 1) -> None:
        self.stage = DynamicsStage(stage)
        self.frequency = int(frequency)
        own = inspect.ismethod(action) and isinstance(action.__self__, Hook)
        self._action: Callable[[], Any] = weakref.WeakMethod(action) if own else lambda: action

    @property
    def action(self) -> Callable[[Batch, Any], None]:
        """What the part calls."""
        action = self._action()
        if action is None:
            raise ReferenceError("this HookPart's hook was freed; keep the hook while its parts run")
        return cast("Callable[[Batch, Any], None]", action)

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        self.action(batch, dynamics)

    def __repr__(self) -> str:
        return f"HookPart({self.stage.name}, {getattr(self.action, '__qualname__', self.action)!r})"
