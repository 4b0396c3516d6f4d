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
from alchemi_core.tuning import CoreTuning

#: For ``@pytest.mark.parametrize("device", CPU_AND_GPU)``: the test runs on the CPU and, marked
#: ``gpu`` and skipped where there is none, on a CUDA GPU.
CPU_AND_GPU = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]),
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tuning", choices=("device", "cuda"), default="device",
        help="the per-device choices the tuning fixtures give: each component's default for the device it "
        "runs on (device), or a GPU's on whatever device the tests run (cuda: its code paths on a CPU)",
    )


def tuning_device(config: pytest.Config) -> str | None:
    """The device whose tunings ``--tuning`` asks for, or None (each component's own default)."""
    chosen = config.getoption("--tuning", default="device")
    return None if chosen == "device" else str(chosen)


@pytest.fixture
def core_tuning(request: pytest.FixtureRequest) -> CoreTuning | None:
    """The engine's tuning for the stages a test builds (``tuning=core_tuning``): None, the
    device's own, unless ``--tuning=cuda`` asks for a GPU's."""
    device = tuning_device(request.config)
    return None if device is None else CoreTuning.for_device(device)


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
