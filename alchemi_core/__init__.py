"""alchemi: batched atomistic simulation on GPUs.

The core holds the data model (:mod:`alchemi_core.data`), the dynamics engine
(:mod:`alchemi_core.dynamics`), the model interface (:mod:`alchemi_core.models`), the
communication interface (:mod:`alchemi_core.comm`) and the plugin registry
(:mod:`alchemi_core.registry`). Everything else comes from plugins.

Importing this package is cheap: it imports neither torch nor any plugin.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
