"""HostMemory passes the sink contract (checkpoints included)."""

from __future__ import annotations

from alchemi_core.dynamics import HostMemory
from alchemi_core.testing.contracts import SinkContract


class TestHostMemory(SinkContract):
    def make_sink(self, capacity):
        return HostMemory(capacity=capacity)
