"""alchemi: batched atomistic simulation on GPUs.

The core holds the data model (:mod:`alchemi_core.data`), the dynamics engine
(:mod:`alchemi_core.dynamics`), the model interface (:mod:`alchemi_core.models`), the
communication interface (:mod:`alchemi_core.comm`) and the plugin registry
(:mod:`alchemi_core.registry`). Everything else comes from plugins.

Importing this package is cheap: it imports neither torch nor any plugin. It arranges for Warp
to stay quiet when something imports it (:mod:`alchemi_core.quiet`; ``ALCHEMI_VERBOSE=1`` to see
Warp's messages).
"""

from __future__ import annotations

from alchemi_core import quiet as _quiet

__version__ = "0.1.0"
_quiet.install()
__all__ = ["__version__"]
