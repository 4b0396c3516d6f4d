"""Every example in alchemi_torchsim's docstrings runs (core's suite runs those of the main
environment's plugins; this one lives in its own)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import alchemi_torchsim

MODULES = ["alchemi_torchsim", *(m.name for m in pkgutil.walk_packages(alchemi_torchsim.__path__, "alchemi_torchsim."))]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
