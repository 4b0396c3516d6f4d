from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

pytest_plugins = ["alchemi_core.testing.fixtures"]

# The tests import their helpers (reference LJ model, recorders) from tests/integrators_testkit.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Iterator[None]:
    """The physics tests run thousands of small steps: on a shared 2-core machine one thread
    avoids oversubscription that makes them several times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip this package's ``gpu`` tests where there is no CUDA device."""
    if torch.cuda.is_available():
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and here in Path(str(item.path)).parents:
            item.add_marker(skip)
