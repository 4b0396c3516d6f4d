"""alchemi-potentials loads as a plugin, registers its five models, and imports nothing heavy."""

from __future__ import annotations

import subprocess
import sys

from alchemi_core import registry


def test_plugin_loads_ok():
    records = {r.name: r for r in registry.plugins()}
    assert records["potentials"].status == "ok", records["potentials"].error


def test_registers_the_five_models_with_their_requirements():
    models = {r.name: r for r in registry.available("model") if r.plugin == "potentials"}
    assert set(models) == {"lennard-jones", "morse", "d3", "sum", "ase"}
    assert dict(models["lennard-jones"].requires) == {"warp": "warp-lang"}
    assert dict(models["morse"].requires) == {"warp": "warp-lang"}
    assert dict(models["ase"].requires) == {"ase": "alchemi-potentials[ase]"}
    assert dict(models["d3"].requires) == {"torch_dftd": "--no-deps torch-dftd", "warp": "warp-lang"}
    assert dict(models["sum"].requires) == {}
    assert registry.resolve("model:morse").__name__ == "Morse"


def test_discovery_imports_neither_warp_nor_torch():
    code = (
        "import sys, alchemi_potentials, alchemi_potentials.plugin; "
        "print(sorted(m for m in ('warp', 'torch', 'ase') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
