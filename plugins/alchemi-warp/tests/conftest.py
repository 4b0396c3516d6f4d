"""Fixtures for alchemi-warp's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from alchemi_core.data.buffer_ops import set_buffer_ops

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


@pytest.fixture
def warp_ops_on_cpu() -> Iterator[object]:
    """Route ``Batch.put``/``defrag``/``zero`` on the CPU through the Warp kernels."""
    from alchemi_warp.buffer_ops import WarpBufferOps

    ops = WarpBufferOps(allow_cpu=True, every_op=True)
    set_buffer_ops("cpu", ops)
    try:
        yield ops
    finally:
        set_buffer_ops("cpu", None)
