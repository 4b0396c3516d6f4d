"""ZarrData passes the sink contract on a local path, on memory://, and in asynchronous mode."""

from __future__ import annotations

import pytest

from alchemi_core.testing.contracts import SinkContract
from alchemi_zarr import ZarrData

from zarr_test_helpers import memory_url


class TestZarrDataLocalPath(SinkContract):
    @pytest.fixture(autouse=True)
    def _tmp(self, tmp_path):
        self.root = tmp_path

    def make_sink(self, capacity):
        return ZarrData(str(self.root / f"sink-{capacity}-{id(object())}.zarr"), capacity=capacity)


class TestZarrDataMemory(SinkContract):
    def make_sink(self, capacity):
        return ZarrData(memory_url("contract"), capacity=capacity)


class TestZarrDataAsynchronous(SinkContract):
    def make_sink(self, capacity):
        return ZarrData(memory_url("contract-async"), capacity=capacity, asynchronous=True)
