"""alchemi-electrostatics: Coulomb energies, forces and stress of per-atom charges by Ewald
summation, particle-mesh Ewald and damped shifted force, from nvalchemi-toolkit-ops, on
alchemi's neighbour lists.

Names are imported on first use, so plugin discovery imports neither Warp nor the ops package.

Example:
    >>> from alchemi_electrostatics import Ewald
    >>> Ewald(cutoff=10.0, accuracy=1e-6).card.name
    'ewald'
"""

from __future__ import annotations

from alchemi_core.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "Ewald": "alchemi_electrostatics.ewald",
    "PME": "alchemi_electrostatics.ewald",
    "DSF": "alchemi_electrostatics.dsf",
    "COULOMB": "alchemi_electrostatics.charges",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
