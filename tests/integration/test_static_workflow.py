"""A workflow file with an ``integrator:static`` stage, run by ``alchemi run``: every structure
stored once, with the energy and stress of the model on that structure alone."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

pytest.importorskip("ase")
pytest.importorskip("alchemi_zarr")
pytest.importorskip("alchemi_potentials")

import ase.io  # noqa: E402
from ase.build import bulk  # noqa: E402

from alchemi_core import registry  # noqa: E402
from alchemi_core.cli import main  # noqa: E402
from alchemi_core.data import Batch  # noqa: E402

WORKFLOW = """\
[model]
component = "model:lennard-jones"
epsilon = 0.0104
sigma = 3.405
cutoff = 8.5125

[input]
path = "cells.extxyz"
dtype = "float64"

[[stage]]
component = "integrator:static"
compute_stress = true

[output]
path = "labelled.zarr"
"""


def _cells() -> list:
    rng = np.random.default_rng(0)
    out = []
    for i, reps in enumerate([(2, 2, 2), (3, 2, 2), (2, 2, 2), (2, 3, 3), (2, 2, 3)]):
        atoms = bulk("Ar", "fcc", a=5.2 + 0.05 * i, cubic=True).repeat(reps)
        atoms.positions += rng.normal(scale=0.05, size=atoms.positions.shape)
        out.append(atoms)
    return out


def test_a_static_stage_labels_every_structure_once(tmp_path, monkeypatch) -> None:
    from alchemi_zarr import AtomicDataZarrReader

    cells = _cells()
    ase.io.write(tmp_path / "cells.extxyz", cells)
    (tmp_path / "workflow.toml").write_text(WORKFLOW)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["run", "workflow.toml", "--json", "--device", "cpu", "--no-progress"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["structures_in"] == summary["structures_out"] == 5 and summary["every_structure_once"]
    assert summary["steps"] <= 5  # one step per structure at most (several share a batch)
    stored = AtomicDataZarrReader(tmp_path / "labelled.zarr").read_batch()
    order = torch.argsort(stored.system_id.view(-1))
    assert stored.system_id.view(-1)[order].tolist() == list(range(5))
    model = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5125)
    cells = ase.io.read(tmp_path / "cells.extxyz", ":")  # as the run read them (the file rounds)
    for i, j in enumerate(order.tolist()):
        ref = model(Batch.from_atoms([cells[i]], dtype=torch.float64), compute_stress=True)
        assert float(stored.energy[j]) == pytest.approx(float(ref["energy"]), rel=0, abs=1e-12)
        torch.testing.assert_close(stored.stress[j], ref["stress"][0], rtol=0, atol=1e-12)


def test_a_static_stage_refuses_convergence_criteria(tmp_path, monkeypatch) -> None:
    ase.io.write(tmp_path / "cells.extxyz", _cells()[:1])
    (tmp_path / "workflow.toml").write_text(WORKFLOW.replace("compute_stress = true",
                                                             "compute_stress = true\nconverge = { fmax = 0.1 }"))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["run", "workflow.toml", "--device", "cpu", "--no-progress"])
    assert result.exit_code != 0
    assert "converges nothing" in result.output
