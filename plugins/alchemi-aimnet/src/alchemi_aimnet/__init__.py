"""alchemi-aimnet: AIMNet2 potentials as alchemi models (``model:aimnet2``); names are imported on
first use, so importing the package imports neither aimnet nor Warp.

Example:
    >>> import alchemi_aimnet
    >>> alchemi_aimnet.__all__
    ['AIMNet2Model']
"""

from __future__ import annotations

from alchemi_core.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {"AIMNet2Model": "alchemi_aimnet.model"}

__all__ = ["AIMNet2Model"]

__getattr__ = lazy_exports(__name__, _EXPORTS)
