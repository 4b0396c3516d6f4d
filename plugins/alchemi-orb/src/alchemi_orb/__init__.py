"""alchemi-orb: ORB potentials as alchemi models (``model:orb``); names are imported on first
use, so importing the package imports neither orb-models nor its neighbour lists.

Example:
    >>> import alchemi_orb
    >>> alchemi_orb.__all__
    ['OrbModel']
"""

from __future__ import annotations

from alchemi_core.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {"OrbModel": "alchemi_orb.model"}

__all__ = ["OrbModel"]

__getattr__ = lazy_exports(__name__, _EXPORTS)
