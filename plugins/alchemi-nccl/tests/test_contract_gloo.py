"""comm:gloo passes the comm-backend contract with real processes over TCP."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from alchemi_core.testing.contracts import CommBackendContract
from alchemi_nccl.spawn import RankPool

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def pool() -> Iterator[RankPool]:
    with RankPool(3) as p:
        yield p


class TestGlooContract(CommBackendContract):
    @pytest.fixture(autouse=True)
    def _use_pool(self, pool: RankPool) -> None:
        self.pool = pool

    def run_group(self, world_size: int, fn: Callable[[Any], Any]) -> list[Any]:
        return self.pool.run(world_size, fn, "comm:gloo", timeout_s=60.0)
