"""Every example in the modules' docstrings runs."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import alchemi_hooks

MODULES = sorted(m.name for m in pkgutil.iter_modules(alchemi_hooks.__path__, "alchemi_hooks."))


@pytest.mark.parametrize("name", ["alchemi_hooks", *MODULES])
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples may name files
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
