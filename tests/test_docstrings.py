"""Every example in the docstrings of alchemi_core and of the first-party plugins in this
environment runs (alchemi-hooks checks its own); examples that need a GPU pick the device."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import alchemi_core


def _modules(package: object) -> list[str]:
    found = [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]  # type: ignore[attr-defined]
    return [package.__name__, *(n for n in found if not n.endswith("__main__"))]  # type: ignore[attr-defined]


def _plugin_modules() -> list[str]:
    names = []
    for plugin in ("alchemi_zarr", "alchemi_potentials", "alchemi_integrators", "alchemi_warp"):
        try:
            names += _modules(importlib.import_module(plugin))
        except ImportError:
            continue
    return names


@pytest.mark.parametrize("name", _modules(alchemi_core) + _plugin_modules())
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples may write files
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
