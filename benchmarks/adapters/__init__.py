"""The frameworks under test, loaded by name; one that cannot be imported becomes a reason.

Example:
    >>> from benchmarks.adapters import FRAMEWORKS, load
    >>> FRAMEWORKS
    ('alchemi', 'nvalchemi', 'torchsim', 'ase')
    >>> load("nope")
    'unknown framework nope; choose from alchemi, nvalchemi, torchsim, ase'
"""

from __future__ import annotations

import importlib

from benchmarks.adapters.base import Framework, Unavailable

#: Every adapter, in table order (alchemi first: ratios are alchemi over each peer).
FRAMEWORKS = ("alchemi", "nvalchemi", "torchsim", "ase")
_MODULES = {
    "alchemi": "benchmarks.adapters.alchemi:Alchemi",
    "nvalchemi": "benchmarks.adapters.nvalchemi:NvAlchemi",
    "torchsim": "benchmarks.adapters.torchsim:TorchSim",
    "ase": "benchmarks.adapters.ase_md:Ase",
}


def load(name: str) -> Framework | str:
    """The adapter ``name``, or a one-line reason why it is not available."""
    if name not in _MODULES:
        return f"unknown framework {name}; choose from {', '.join(FRAMEWORKS)}"
    module, attr = _MODULES[name].split(":")
    try:
        return getattr(importlib.import_module(module), attr)()
    except Unavailable as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - a peer's import can fail in any way; report it
        return f"import failed: {type(exc).__name__}: {exc}"


__all__ = ["FRAMEWORKS", "Framework", "Unavailable", "load"]
