"""Weak references from an engine, or a pipeline rank, back to the stages that own it.

A stage holds its engine (``dynamics._engine``) so that ``step()``, ``step_count`` and
``quarantined`` work after ``run()``; the engine, its hook tables and its run view refer back to
the stage and to themselves only weakly. Without that, every finished run formed a reference
cycle (stage -> engine -> stage) that only Python's cycle collector frees, with its batch and
buffers (on a GPU, device memory). A pipeline stage holds its ``PipelineRank`` the same way (``stage.pipeline_rank``),
and the rank refers back weakly too.

Example:
    >>> from alchemi_core.dynamics import DemoDynamics
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> from alchemi_core.testing import make_batch
    >>> from alchemi_core.testing.lifetime import collector_off
    >>> with collector_off():
    ...     md = DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5)
    ...     batch = md.run(make_batch([2]))
    ...     engine = ref_to(md._engine)
    ...     del md, batch
    ...     engine() is None  # freed without the cycle collector
    True
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from alchemi_core.errors import ConfigurationError


def ref_to(obj: Any) -> Callable[[], Any]:
    """A weak reference to ``obj``; for an object that takes none (a name in an example), a
    function that returns it."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def alive(ref: Callable[[], Any], what: str, holder: str = "engine") -> Any:
    """The object behind ``ref``, or a clear error where it was freed (``holder``: what held it,
    an engine or a pipeline rank)."""
    obj = ref()
    if obj is None:
        raise ConfigurationError(
            f"this {holder}'s {what} was freed: {holder}s run only while the stage that made them is "
            "alive (keep a reference to the stage you call run() or step() on, or to the pipeline)"
        )
    return obj
