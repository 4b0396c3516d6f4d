"""On a full install every first-party plugin loads and provides what the design names."""

from __future__ import annotations

import json
import subprocess
import sys

from alchemi_core.plugin import first_party


def test_list_plugins_shows_the_six_first_party_plugins_ok():
    proc = subprocess.run([sys.executable, "-m", "alchemi_core.cli", "list-plugins", "--json", "--strict"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    plugins = {p["distribution"]: p for p in json.loads(proc.stdout)["plugins"]}
    for dist in first_party.in_env("main"):  # plugins with their own environment are not installed here
        provided = first_party.by_name()[dist].provides
        assert plugins[dist]["status"] == "ok", plugins[dist]
        components = {p for p in provided if ":" in p and not p.startswith("alchemi_core.")}
        assert components <= set(plugins[dist]["provides"]), (dist, components - set(plugins[dist]["provides"]))
