"""alchemi-sevennet: SevenNet potentials as alchemi models (``model:sevennet``); names are
imported on first use, so importing the package imports neither SevenNet nor e3nn.

Example:
    >>> import alchemi_sevennet
    >>> alchemi_sevennet.__all__
    ['SevenNetModel']
"""

from __future__ import annotations

from alchemi_core.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {"SevenNetModel": "alchemi_sevennet.model"}

__all__ = ["SevenNetModel"]

__getattr__ = lazy_exports(__name__, _EXPORTS)
