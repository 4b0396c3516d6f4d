"""`alchemi demo`, the README's main job: relax then NVT MD in one fused inflight stage."""

from __future__ import annotations

import json

from click.testing import CliRunner

from alchemi_core.cli import main


def test_demo_accounts_for_every_structure_and_thermalises():
    result = CliRunner().invoke(main, ["demo", "--structures", "24", "--md-steps", "150", "--json", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):])
    assert summary["structures_in"] == summary["structures_out"] == 24
    assert summary["every_structure_once"] is True
    # FIRE-relaxed FCC argon sits near the LJ cohesive energy (about -0.08 eV/atom with this cutoff).
    assert -0.085 < summary["mean_energy_per_atom_eV"] < -0.07
    # 150 Langevin steps at 50 K starting from 50 K: a sample mean over 24 small cells.
    assert 35.0 < summary["mean_temperature_K"] < 65.0
