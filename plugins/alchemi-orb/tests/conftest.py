"""Fixtures: ORB networks of the orb-v3 architectures with random weights, small enough for two
CPU cores, saved as orb-models saves its models (a state dict) and loaded with its own loader."""

from __future__ import annotations

import pytest
import torch
from alchemi_orb.testing import saved_and_loaded

pytest_plugins = ["alchemi_core.testing.fixtures"]


@pytest.fixture(scope="session")
def conservative(tmp_path_factory):
    """``(network, adapter)``: a small orb-v3 conservative network, float32."""
    return saved_and_loaded("conservative", tmp_path_factory.mktemp("orb"), seed=0)


@pytest.fixture(scope="session")
def direct(tmp_path_factory):
    """``(network, adapter)``: a small orb-v3 direct network, float32."""
    return saved_and_loaded("direct", tmp_path_factory.mktemp("orb"), seed=1)


@pytest.fixture(scope="session")
def conservative64(tmp_path_factory):
    """``(network, adapter)``: a small orb-v3 conservative network, float64."""
    return saved_and_loaded("conservative", tmp_path_factory.mktemp("orb"), seed=3, dtype=torch.float64)


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
