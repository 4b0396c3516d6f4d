"""The one error hierarchy of alchemi.

Every error alchemi raises on purpose derives from :class:`AlchemiError`, so a caller can catch
them all at once. Where Python already has the right meaning (a wrong value, a full buffer), the
alchemi error also derives from the built-in class (``ValueError``, ``RuntimeError``,
``ImportError``, ``LookupError``), so code written against the seed's documented exceptions keeps
working.

Messages name the component, the plugin that provides it and the fix.
"""

from __future__ import annotations


class AlchemiError(Exception):
    """Base class of every error alchemi raises on purpose."""


class ConfigurationError(AlchemiError, ValueError):
    """A component was configured with values that cannot work together."""


class InvalidDataError(AlchemiError, ValueError):
    """Input data has a wrong shape, dtype or value (NaN positions, a missing field, ...)."""


class DamagedCheckpointError(InvalidDataError):
    """A checkpoint file is truncated, fails its checksum, holds more than data, or contradicts
    itself; the message names the file and, where its header is readable, the run that made it."""


class CapacityError(AlchemiError, RuntimeError):
    """A buffer or sink has no room for what it was asked to hold; nothing was written."""


class ComponentNotFoundError(AlchemiError, LookupError):
    """No installed plugin provides the component that was asked for."""


class ComponentConflictError(AlchemiError):
    """Two plugins register the same ``kind:name``."""


class PluginLoadError(AlchemiError, ImportError):
    """A plugin failed to load, or a component of a failed plugin was asked for."""


class MissingDependencyError(AlchemiError, ImportError):
    """A component needs an optional package that is not installed."""


class ModelNotAvailableError(AlchemiError, FileNotFoundError):
    """A model named by name whose file is not on this machine and was not (or could not be)
    downloaded; the message says which file to place where, or how to allow the download."""


class PipelineError(AlchemiError, RuntimeError):
    """A distributed pipeline failed: a peer rank died, timed out or raised."""


__all__ = [
    "AlchemiError",
    "CapacityError",
    "ComponentConflictError",
    "ComponentNotFoundError",
    "ConfigurationError",
    "DamagedCheckpointError",
    "InvalidDataError",
    "MissingDependencyError",
    "PipelineError",
    "PluginLoadError",
]
