"""pytest fixtures for alchemi and plugin test suites.

Enable in a ``conftest.py`` with ``pytest_plugins = ["alchemi_core.testing.fixtures"]``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import torch

from alchemi_core import registry
from alchemi_core.plugin.manager import PluginManager
from alchemi_core.testing.plugins import FAKE_DISTS, isolated_manager

#: For ``@pytest.mark.parametrize("device", CPU_AND_GPU)``: the test runs on the CPU and, marked
#: ``gpu`` and skipped where there is none, on a CUDA GPU.
CPU_AND_GPU = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]),
]


@pytest.fixture
def isolated_registry() -> Iterator[PluginManager]:
    """A registry with discovery blocked: core's built-ins only."""
    with isolated_manager() as pm:
        yield pm


@pytest.fixture
def fake_plugins_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Put the fake distributions on ``sys.path`` and reset the registry around the test."""
    monkeypatch.syspath_prepend(str(FAKE_DISTS))
    for mod in [m for m in sys.modules if m.startswith("alchemi_fake_")]:
        monkeypatch.delitem(sys.modules, mod)
    old = registry.use_manager(None)
    try:
        yield str(FAKE_DISTS)
    finally:
        registry.use_manager(old)
