"""alchemi-hooks: per-step hooks for alchemi dynamics.

Each hook lives in a module of its own and is registered as ``hook:<name>``; import them from
``alchemi_core.dynamics.hooks`` (or from their module here):

============================  ==========================  ===================================
``hook:max-force-clamp``      ``MaxForceClampHook``       :mod:`alchemi_hooks.clamp`
``hook:logging``              ``LoggingHook``             :mod:`alchemi_hooks.logger`
``hook:snapshot``             ``SnapshotHook``            :mod:`alchemi_hooks.snapshot`
``hook:converged-snapshot``   ``ConvergedSnapshotHook``   :mod:`alchemi_hooks.snapshot`
``hook:nan-detector``         ``NaNDetectorHook``         :mod:`alchemi_hooks.nonfinite`
``hook:energy-drift``         ``EnergyDriftMonitorHook``  :mod:`alchemi_hooks.drift`
``hook:freeze-atoms``         ``FreezeAtomsHook``         :mod:`alchemi_hooks.freeze`
``hook:wrap-periodic``        ``WrapPeriodicHook``        :mod:`alchemi_hooks.wrap`
``hook:progress``             ``ProgressHook``            :mod:`alchemi_hooks.progress`
``hook:stage-timing``         ``StageTimingHook``         :mod:`alchemi_hooks.timing`
============================  ==========================  ===================================

Every hook acts only on the systems of the stage it is given to (``dynamics.context.system_mask``), so
it works alike in a single stage, in a ``FusedStage`` and under inflight refill.

Example:
    >>> from alchemi_core.dynamics.hooks import MaxForceClampHook, LoggingHook
    >>> hooks = [MaxForceClampHook(max_force=10.0), LoggingHook(log_path="md_log.csv", frequency=100)]
"""

from __future__ import annotations

__version__ = "0.1.0"
