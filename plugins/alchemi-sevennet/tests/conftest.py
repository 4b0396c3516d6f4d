"""Fixtures: SevenNet's 7net-0 (it ships inside the sevenn wheel), loaded once."""

from __future__ import annotations

import pytest
import torch

pytest_plugins = ["alchemi_core.testing.fixtures"]


@pytest.fixture(scope="session")
def seven_net():
    from alchemi_sevennet import SevenNetModel

    return SevenNetModel("7net-0")


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
