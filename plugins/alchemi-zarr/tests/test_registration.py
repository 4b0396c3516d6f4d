"""alchemi-zarr loads as a plugin and serves the seed's public names."""

from __future__ import annotations

from zarr_test_helpers import memory_url

from alchemi_core import registry
from alchemi_zarr.reader import AtomicDataZarrReader
from alchemi_zarr.sink import ZarrData
from alchemi_zarr.writer import AtomicDataZarrWriter


def test_plugin_loads_ok():
    records = {r.name: r for r in registry.plugins()}
    assert records["zarr"].status == "ok", records["zarr"].error


def test_public_names_resolve_to_the_plugin_classes():
    from alchemi_core.data.datapipes import AtomicDataZarrReader as Reader
    from alchemi_core.data.datapipes import AtomicDataZarrWriter as Writer
    from alchemi_core.dynamics import ZarrData as Sink

    assert Sink is ZarrData and Reader is AtomicDataZarrReader and Writer is AtomicDataZarrWriter
    assert registry.resolve("sink:zarr") is ZarrData


def test_build_makes_a_working_sink():
    from alchemi_core.testing import make_batch

    sink = registry.build("sink:zarr", store=memory_url(), capacity=5)
    sink.write(make_batch([2, 2]))
    assert len(sink) == 2 and sink.capacity == 5
