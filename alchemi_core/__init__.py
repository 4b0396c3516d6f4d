"""alchemi: batched atomistic simulation on GPUs.

The core holds the data model (:mod:`alchemi_core.data`), the dynamics engine
(:mod:`alchemi_core.dynamics`), the model interface (:mod:`alchemi_core.models`), the
communication interface (:mod:`alchemi_core.comm`) and the plugin registry
(:mod:`alchemi_core.registry`), and ``evaluate``/``relax`` for a list of ASE structures
(:mod:`alchemi_core.simulate`). Everything else comes from plugins.

Importing this package is cheap: it imports neither torch nor any plugin. It arranges for Warp
to stay quiet when something imports it (:mod:`alchemi_core.quiet`; ``ALCHEMI_VERBOSE=1`` to see
Warp's messages).
"""

from __future__ import annotations

from alchemi_core import quiet as _quiet
from alchemi_core.lazy import lazy_exports

__version__ = "0.1.0"
_quiet.install()
__all__ = ["__version__", "evaluate", "relax"]
# ``evaluate``/``relax`` (alchemi_core.simulate) import torch: only when first asked for.
__getattr__ = lazy_exports(__name__, {"evaluate": "alchemi_core.simulate", "relax": "alchemi_core.simulate"})
