"""A run that quarantines structures says so once, with the count and the reasons (issue 59,
item 7: a structure quarantined during ``stage.run(batch)`` left only its status code)."""

from __future__ import annotations

import warnings

import pytest
import torch

from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import ConvergenceHook, DemoDynamics, FusedStage, HostMemory, SizeAwareSampler
from alchemi_core.dynamics.quarantine import QuarantineWarning
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import make_batch, random_structures
from alchemi_core.testing.exploding import ExplodingModel


def _caught(run):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [w for w in caught if issubclass(w.category, QuarantineWarning)]


def test_stage_run_warns_once_with_the_count_and_the_reasons():
    model = ExplodingModel(DemoModelWrapper(), explode=[0, 2], after=3)
    stage = DemoDynamics(model=model, n_steps=60, dt=0.5)
    found = _caught(lambda: stage.run(make_batch([3, 4, 2], dtype=torch.float64)))
    assert len(found) == 1
    text = str(found[0].message)
    assert text.startswith("2 structures quarantined (2: ") and "forces are not finite" in text
    assert "system_id 0, 2" in text
    assert found[0].filename == __file__  # points at the caller's run()


def test_a_fused_run_with_a_sampler_warns_once_and_a_clean_run_not_at_all():
    data = ListDataset(random_structures([3, 4, 5] * 4, dtype=torch.float64))
    model = ExplodingModel(DemoModelWrapper(), explode=[4, 9])
    relax = DemoDynamics(model=model, n_steps=12, dt=0.5, convergence_hook=ConvergenceHook.from_fmax(1e-9, frequency=2))
    relax.sampler = SizeAwareSampler(data, max_atoms=14, max_batch_size=3, bin_width=1)
    relax.refill_frequency = 2
    fused = FusedStage([(0, relax)], sinks=[HostMemory(capacity=None)])
    found = _caught(fused.run)
    assert len(found) == 1 and str(found[0].message).startswith("2 structures quarantined")
    clean = DemoDynamics(model=DemoModelWrapper(), n_steps=20, dt=0.5)
    assert _caught(lambda: clean.run(make_batch([3, 4], dtype=torch.float64))) == []


def test_alchemi_run_lists_quarantined_structures_in_its_summary(tmp_path, monkeypatch):
    pytest.importorskip("ase")
    pytest.importorskip("alchemi_zarr")
    pytest.importorskip("alchemi_potentials")
    import json
    import shutil

    import ase.io
    from ase.build import bulk
    from click.testing import CliRunner

    from alchemi_core.cli import main

    frames = []
    for i in range(4):
        atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(2)
        atoms.rattle(0.05, seed=i)
        if i in (1, 3):  # two atoms on top of each other: Lennard-Jones blows them apart
            atoms.positions[1] = atoms.positions[0] + 0.001
        frames.append(atoms)
    ase.io.write(tmp_path / "in.extxyz", frames)
    (tmp_path / "wf.toml").write_text("""
[model]
component = "model:lennard-jones"
epsilon = 0.0104
sigma = 3.405
cutoff = 8.5125
[input]
path = "in.extxyz"
[[stage]]
component = "integrator:fire"
n_steps = 100
dt = 5.0
converge = { fmax = 0.05 }
[output]
path = "results.zarr"
""")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["run", "wf.toml", "--device", "cpu", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert sorted(q["system_id"] for q in summary["quarantined"]) == [1, 3]
    assert all(q["status"] < 0 and "not finite" in q["reason"] for q in summary["quarantined"])
    assert summary["structures_out"] == 2 and summary["every_structure_once"]
    shutil.rmtree(tmp_path / "results.zarr")  # the same ids again, not appended after these
    text = CliRunner().invoke(main, ["run", "wf.toml", "--device", "cpu", "--no-progress"]).stdout
    assert "4 / 2 + 2 quarantined (each exactly once)" in text
    assert "quarantined            2 structures quarantined (2: " in text and "system_id 1, 3" in text
    # The store reads back whole, failures included; export writes the others and names the failures.
    from alchemi_zarr import ZarrData

    stored = ZarrData("results.zarr").read()
    assert sorted(stored.status.view(-1).tolist()) == [-3, -3, 1, 1]
    done = CliRunner().invoke(main, ["export", "results.zarr", "out.extxyz", "--json"], catch_exceptions=False)
    assert json.loads(done.stdout) == {"schema_version": 1, "store": "results.zarr", "out": "out.extxyz",
                                       "frames": 2, "quarantined_not_written": [1, 3]}
    assert sorted(a.info["system_id"] for a in ase.io.read("out.extxyz", ":")) == [0, 2]


def test_an_in_process_pipeline_warns_once_for_all_its_ranks():
    first = DemoDynamics(model=ExplodingModel(DemoModelWrapper(), explode=[1], after=2), n_steps=6, dt=0.5)
    second = DemoDynamics(model=DemoModelWrapper(), n_steps=6, dt=0.5)
    found = _caught(lambda: (first | second).run(make_batch([3, 4, 2], dtype=torch.float64)))
    assert len(found) == 1 and "system_id 1" in str(found[0].message)
    assert found[0].filename == __file__
