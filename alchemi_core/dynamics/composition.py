"""``a + b`` and ``a | b``: composing stages.

``a + b`` fuses stages into one ``FusedStage`` that runs on one device with one model forward
per step; ``a | b`` puts them on consecutive ranks of a ``DistributedPipeline``. A stage's
operators call :func:`build`; what they build is registered by the module that defines it
(``fused`` registers ``+``, ``pipeline`` registers ``|``), so the stage classes import neither:
a fused stage and a pipeline are made of stages, not the reverse.

Example:
    >>> from alchemi_core.dynamics import DemoDynamics
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> model = DemoModelWrapper()
    >>> relax, md = DemoDynamics(model=model, n_steps=5), DemoDynamics(model=model, n_steps=5)
    >>> type(relax + md).__name__, type(relax | md).__name__
    ('FusedStage', 'DistributedPipeline')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from alchemi_core.errors import AlchemiError

#: What each operator builds: ``builder(left, right)``, or ``NotImplemented`` for operands it
#: does not take.
_BUILDERS: dict[str, Callable[[Any, Any], Any]] = {}


def register(operator: str, builder: Callable[[Any, Any], Any]) -> None:
    """Make ``builder(left, right)`` what ``left <operator> right`` returns (``"+"`` or ``"|"``)."""
    if operator not in ("+", "|"):
        raise ValueError(f"unknown operator {operator!r}")
    _BUILDERS[operator] = builder


def build(operator: str, left: Any, right: Any) -> Any:
    """``left <operator> right``: what the registered builder makes of them."""
    builder = _BUILDERS.get(operator)
    if builder is None:  # only when alchemi_core.dynamics itself failed to import
        raise AlchemiError(f"no builder for {operator!r}: import alchemi_core.dynamics first")
    return builder(left, right)
