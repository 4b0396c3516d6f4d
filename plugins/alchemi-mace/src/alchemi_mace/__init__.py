"""alchemi-mace: MACE potentials as alchemi models (``model:mace``); names are imported on first
use, so importing the package imports neither MACE nor e3nn.

Example:
    >>> import alchemi_mace
    >>> alchemi_mace.__all__
    ['MaceModel', 'import_mace']
"""

from __future__ import annotations

from alchemi_core.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "MaceModel": "alchemi_mace.model",
    "import_mace": "alchemi_mace.imports",
}

__all__ = ["MaceModel", "import_mace"]

__getattr__ = lazy_exports(__name__, _EXPORTS)
