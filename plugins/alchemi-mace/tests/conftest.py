"""Fixtures: MACE networks with random weights, saved as .model files like foundation models."""

from __future__ import annotations

import alchemi_mace.imports
import pytest
import torch

alchemi_mace.imports.import_mace()  # before anything imports e3nn

pytest_plugins = ["alchemi_core.testing.fixtures"]


@pytest.fixture(scope="session")
def mp_small_file(tmp_path_factory):
    """A MACE-MP-0-small-shaped network (random weights, seed 0) saved as a .model file."""
    from alchemi_mace.random_model import mace_mp_small_like

    path = tmp_path_factory.mktemp("mace") / "mp_small_like.model"
    torch.save(mace_mp_small_like(seed=0, dtype=torch.float64), path)
    return path


@pytest.fixture(scope="session")
def tiny_net():
    """A small network for runs of many steps on the CPU."""
    from alchemi_mace.random_model import mace_mp_small_like

    return mace_mp_small_like(seed=1, channels=8, max_ell=1, correlation=2, r_max=4.5, dtype=torch.float64)


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
