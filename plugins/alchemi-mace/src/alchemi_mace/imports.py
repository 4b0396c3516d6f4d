"""Importing MACE in the one order that works: e3nn 0.4.4 (which mace-torch pins) imports under
torch >= 2.6 only after ``import mace`` set ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` (alchemi reads
its own checkpoints with ``weights_only=True``). Everything here that touches MACE or e3nn goes
through :func:`import_mace`.

Example:
    >>> mace = import_mace()
    >>> mace.__name__
    'mace'
"""

from __future__ import annotations

import sys
from typing import Any

from alchemi_core.errors import MissingDependencyError


def import_mace() -> Any:
    """``import mace`` (before anything imports e3nn) and return the module.

    Raises:
        MissingDependencyError: mace-torch is not installed, or e3nn was imported before it and
            failed to (the message says how to fix the order).
    """
    if "mace" in sys.modules:
        return sys.modules["mace"]
    e3nn_first = "e3nn" in sys.modules
    try:
        import mace
        import mace.modules
    except ImportError as exc:
        hint = (" (e3nn was imported before mace: import alchemi_mace or mace first)" if e3nn_first else "")
        raise MissingDependencyError(
            f"model:mace needs mace-torch (which pins e3nn==0.4.4): pip install mace-torch{hint}: {exc}"
        ) from exc
    return mace
