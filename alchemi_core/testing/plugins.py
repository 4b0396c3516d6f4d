"""Fake plugins for testing discovery without pip, and a helper to register one temporarily.

``FAKE_DISTS`` is a folder with three installed-looking distributions (``*.dist-info`` with an
``entry_points.txt`` in the group ``alchemi.plugins``):

* ``alchemi-fake-good``: registers ``model:fake-good`` and ``integrator:fake-good``;
* ``alchemi-fake-broken``: its module raises ``ImportError`` when imported;
* ``alchemi-fake-unknown-hook``: implements a misspelt hook, ``alchemi_regster_models``.

Put it on ``sys.path`` (or ``PYTHONPATH`` for a subprocess) and ``importlib.metadata`` finds them.

Example:
    >>> from alchemi_core.testing import temporary_plugin
    >>> from alchemi_core.plugin import hookimpl
    >>> class MyPlugin:
    ...     @staticmethod
    ...     @hookimpl
    ...     def alchemi_register_models(registrar):
    ...         registrar.add("mine", "alchemi_core.models.demo:DemoModelWrapper")
    >>> with temporary_plugin(MyPlugin, name="mine") as pm:
    ...     "model:mine" in pm.components
    True
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alchemi_core import registry
from alchemi_core.plugin.manager import PluginManager

FAKE_DISTS = Path(__file__).parent / "fake_dists" / "site"


@contextlib.contextmanager
def isolated_manager(builtins: bool = True, strict: bool = False) -> Iterator[PluginManager]:
    """A registry with core's built-ins only (no installed plugins), restored afterwards."""
    pm = PluginManager.discover(entry_points=False, builtins=builtins, strict=strict)
    old = registry.use_manager(pm)
    try:
        yield pm
    finally:
        registry.use_manager(old)


@contextlib.contextmanager
def temporary_plugin(plugin: Any, name: str = "temporary", builtins: bool = True) -> Iterator[PluginManager]:
    """An isolated registry holding core's built-ins plus ``plugin`` (a module or an object with
    hook implementations), as if it were installed under ``name``."""
    with isolated_manager(builtins=builtins) as pm:
        module = plugin
        if not isinstance(plugin, types.ModuleType):
            module = types.ModuleType(name)
            for attr in dir(plugin):
                if attr.startswith("alchemi_"):
                    setattr(module, attr, getattr(plugin, attr))
        pm._load_module(name, module, name, "0", f"{name} = (temporary)", False, strict=True)
        yield pm
