"""ZarrData passes the sink contract on a local path, on memory://, and in asynchronous mode."""

from __future__ import annotations

import pytest
from zarr_test_helpers import memory_url

from alchemi_core.testing.contracts import SinkContract
from alchemi_zarr import ZarrData


class TestZarrDataLocalPath(SinkContract):
    @pytest.fixture(autouse=True)
    def _tmp(self, tmp_path):
        self.root = tmp_path

    def make_sink(self, capacity):
        return ZarrData(str(self.root / f"sink-{capacity}-{id(object())}.zarr"), capacity=capacity)

    def reopen(self, sink):
        return ZarrData(sink.store.where, capacity=sink.capacity)


class TestZarrDataMemory(SinkContract):
    def make_sink(self, capacity):
        self.url = memory_url("contract")
        return ZarrData(self.url, capacity=capacity)

    def reopen(self, sink):
        return ZarrData(self.url, capacity=sink.capacity)


class TestZarrDataAsynchronous(SinkContract):
    def make_sink(self, capacity):
        self.url = memory_url("contract-async")
        return ZarrData(self.url, capacity=capacity, asynchronous=True)

    def reopen(self, sink):
        return ZarrData(self.url, capacity=sink.capacity, asynchronous=True)
