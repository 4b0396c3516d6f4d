"""Fixtures of alchemi_core's test suite; models come from alchemi_torchsim.testing."""

from __future__ import annotations

import mace  # noqa: F401 - before anything imports e3nn (mace-torch pins e3nn 0.4.4)
import pytest
import torch

pytest_plugins = ["alchemi_core.testing.fixtures"]


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
