"""Every example in alchemi-properties' docstrings runs (core's test_docstrings covers core and
the other plugins)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import alchemi_properties

MODULES = ["alchemi_properties", *(m.name for m in pkgutil.walk_packages(alchemi_properties.__path__, "alchemi_properties."))]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples may write files
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
