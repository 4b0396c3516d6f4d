"""Checking that what a run leaves behind is freed by reference counting alone.

A stage, its engine and its batch should go as soon as the caller drops them, not when Python's
cycle collector next runs: on a GPU, a loop of runs otherwise holds many runs' device memory at
once (``alchemi_core.dynamics.weak``).

Example:
    >>> from alchemi_core.dynamics import DemoDynamics
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> from alchemi_core.testing import make_batch
    >>> with collector_off():
    ...     md = DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5)
    ...     batch = make_batch([2, 3])
    ...     _ = md.run(batch)
    ...     refs = watch(md, md._engine, batch)
    ...     del md, batch, _
    >>> still_alive(refs)
    []
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from alchemi_core.dynamics.capture import collector_held


@contextmanager
def collector_off() -> Iterator[None]:
    """Collect what earlier code left, then keep the cycle collector off inside the block."""
    gc.collect()
    with collector_held():
        yield


def watch(*objects: Any) -> list[tuple[str, weakref.ref[Any]]]:
    """Weak references to ``objects``, each with its type's name for a failure message."""
    return [(type(o).__name__, weakref.ref(o)) for o in objects]


def still_alive(refs: list[tuple[str, weakref.ref[Any]]]) -> list[str]:
    """The names of the watched objects that are still alive."""
    return [name for name, ref in refs if ref() is not None]
