"""Every example in the docstrings of alchemi_core and alchemi-zarr runs (alchemi-hooks checks
its own; alchemi-warp's need Warp's banner silenced and some a GPU)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import alchemi_core


def _modules(package: object) -> list[str]:
    found = [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]  # type: ignore[attr-defined]
    return [package.__name__, *(n for n in found if not n.endswith("__main__"))]  # type: ignore[attr-defined]


def _zarr_modules() -> list[str]:
    try:
        import alchemi_zarr
    except ImportError:
        return []
    return _modules(alchemi_zarr)


@pytest.mark.parametrize("name", _modules(alchemi_core) + _zarr_modules())
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples may write files
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
