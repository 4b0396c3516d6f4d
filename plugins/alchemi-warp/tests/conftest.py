"""Fixtures for alchemi-warp's tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest_plugins = ["alchemi_core.testing.fixtures"]

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip this package's ``gpu``-marked tests on machines without CUDA."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and _HERE in Path(str(item.fspath)).parents:
            item.add_marker(skip)
