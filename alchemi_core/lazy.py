"""Package attributes imported on first use, so importing a package (a plugin's entry point
imports its package) pulls in nothing heavy.

Example:
    >>> __getattr__ = lazy_exports("demo_pkg", {"sqrt": "math"})
    >>> __getattr__("sqrt")(9.0)
    3.0
    >>> __getattr__("cbrt2")
    Traceback (most recent call last):
    ...
    AttributeError: module 'demo_pkg' has no attribute 'cbrt2'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports ``exports[name]`` (a module path)
    when ``name`` is first asked for and returns that module's attribute of the same name."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
