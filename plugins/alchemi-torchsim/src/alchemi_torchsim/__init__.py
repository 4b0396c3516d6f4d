"""alchemi-torchsim: any TorchSim model (a ``torch_sim.models.interface.ModelInterface``) as an
alchemi model, ``model:torchsim``. Names are imported on first use, so plugin discovery does not
import TorchSim.

Example:
    >>> import alchemi_torchsim
    >>> alchemi_torchsim.__all__
    ['TorchSimModel']
"""

from __future__ import annotations

from alchemi_core.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {"TorchSimModel": "alchemi_torchsim.model"}

__all__ = ["TorchSimModel"]

__getattr__ = lazy_exports(__name__, _EXPORTS)
