"""alchemi-electrostatics registers model:ewald, model:pme and model:dsf, builds them from specs
(model:sum tables too), and its entry point imports nothing heavy."""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys

import pytest
import torch

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.plugin.manager import PluginManager


@pytest.fixture
def plugins():
    """The installed plugins' manager, with this plugin and alchemi-potentials (model:sum) loaded
    from their entry points whether or not they are installed."""
    eps = [md.EntryPoint(name=n, value=f"alchemi_{n}.plugin", group="alchemi.plugins")
           for n in ("electrostatics", "potentials")]
    old = registry.use_manager(PluginManager.discover(entry_points=eps, strict=True))
    yield
    registry.use_manager(old)


def test_the_three_models_build_from_specs_and_in_a_sum(plugins, nacl):
    models = {r.name: r for r in registry.available("model") if r.plugin == "electrostatics"}
    assert set(models) == {"ewald", "pme", "dsf"}
    assert dict(models["pme"].requires) == {"nvalchemiops": "nvalchemi-toolkit-ops", "warp": "warp-lang"}
    batch = Batch.from_atoms([nacl], dtype=torch.float64)
    ewald = registry.build("model:ewald", cutoff=8.0, accuracy=1e-8)
    both = registry.build("model:sum", models=[{"model": "model:pme", "cutoff": 8.0, "accuracy": 1e-8},
                                               {"model": "model:dsf", "alpha": 0.25, "cutoff": 15.0}])
    torch.testing.assert_close(both(batch)["energy"], 2 * ewald(batch)["energy"], rtol=1e-6, atol=0)


def test_discovery_imports_neither_warp_nor_torch_nor_the_ops():
    code = ("import sys, alchemi_electrostatics, alchemi_electrostatics.plugin; "
            "print(sorted(m for m in ('warp', 'torch', 'nvalchemiops') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
