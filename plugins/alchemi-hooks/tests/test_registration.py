"""alchemi-hooks loads as a plugin."""

from __future__ import annotations

from alchemi_core import registry


def test_plugin_loads_ok():
    records = {r.name: r for r in registry.plugins()}
    assert records["hooks"].status == "ok", records["hooks"].error
