"""Hooks provided by plugins (``alchemi-hooks``): ``MaxForceClampHook``, ``LoggingHook``,
``SnapshotHook``, ... Each resolves through the registry when imported from here.

Example:
    >>> from alchemi_core.dynamics.hooks import MaxForceClampHook  # needs alchemi-hooks
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    from alchemi_core.registry import resolve_export

    return resolve_export(__name__, name)
