"""alchemi-hooks: per-step hooks for alchemi dynamics.

Each hook lives in a module of its own and is registered as ``hook:<name>`` (the list is
:data:`alchemi_hooks.plugin.HOOKS`); import them from ``alchemi_core.dynamics.hooks``. Every
hook acts only on the systems of the stage it is given to (``dynamics.context.system_mask``), so
it works alike in a single stage, in a ``FusedStage`` and under inflight refill.

Example:
    >>> from alchemi_core.dynamics.hooks import MaxForceClampHook, LoggingHook
    >>> hooks = [MaxForceClampHook(max_force=10.0), LoggingHook(log_path="md_log.csv", frequency=100)]
"""

from __future__ import annotations

__version__ = "0.1.0"
