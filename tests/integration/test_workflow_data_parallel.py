"""``torchrun --nproc-per-node=2 alchemi run workflow.toml``: real torchrun, two CPU ranks over
gloo, one sharded store holding every structure once with the results of a one-process run; a
rerun into the same store runs nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("ase")
pytest.importorskip("alchemi_zarr")
pytest.importorskip("alchemi_potentials")
pytest.importorskip("alchemi_integrators")

import ase.io  # noqa: E402
from ase.build import bulk  # noqa: E402

from alchemi_core.workflow import load_workflow  # noqa: E402
from alchemi_core.workflow.data_parallel import run_workflow_data_parallel  # noqa: E402

pytestmark = pytest.mark.multiprocess

#: Deterministic stages (FIRE checked every step, then NVE), so any split gives the same results.
WORKFLOW = """\
[model]
component = "model:lennard-jones"
epsilon = 0.0104
sigma = 3.405
cutoff = 8.5125

[input]
path = "structures"

[[stage]]
component = "integrator:fire"
n_steps = 60
dt = 5.0
converge = {{ fmax = 0.05, frequency = 1 }}

[[stage]]
component = "integrator:velocity-verlet"
n_steps = 20
dt = 5.0

[output]
path = "{store}"
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    (tmp_path / "structures").mkdir()
    frames = []
    for i in range(7):
        atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((1 + i % 2, 2, 2))
        atoms.positions += rng.normal(scale=0.05, size=atoms.positions.shape)
        frames.append(atoms)
    ase.io.write(tmp_path / "structures" / "ar.extxyz", frames)
    for name in ("dp", "one"):
        (tmp_path / f"{name}.toml").write_text(WORKFLOW.format(store=f"{name}.zarr"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def energies(root):
    from alchemi_zarr import ShardedZarrReader

    batch = ShardedZarrReader(root).read_batch()
    ids = batch.system_id.tolist()
    assert len(ids) == len(set(ids)), f"a structure is stored twice: {sorted(ids)}"
    return dict(zip(ids, batch.energy.reshape(-1).double().tolist(), strict=True))


def test_torchrun_alchemi_run_fills_one_store_and_a_rerun_runs_nothing(project):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "-m", "alchemi_core.cli",
           "run", "dp.toml", "--device", "cpu", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=project)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout[done.stdout.index("{"):])  # rank 0 alone prints
    assert (summary["ranks"], summary["structures_in"], summary["structures_out"]) == (2, 7, 7)
    assert summary["every_structure_once"] and summary["ran"] == 7
    assert sorted(p.name for p in (project / "dp.zarr").iterdir() if p.is_dir()) == ["part-00000", "part-00001"]
    assert sorted((project).glob("dp.part-0000*.log.csv")), "each rank logs to its own file"

    one = run_workflow_data_parallel(load_workflow("one.toml"), device="cpu", progress=False)
    assert one["ranks"] == 1 and one["every_structure_once"]
    got, want = energies(project / "dp.zarr"), energies(project / "one.zarr")
    assert sorted(got) == list(range(7))
    for i, e in want.items():
        assert got[i] == pytest.approx(e, rel=1e-5, abs=1e-6), f"structure {i}"

    again = run_workflow_data_parallel(load_workflow("dp.toml"), device="cpu", progress=False)
    assert (again["ran"], again["skipped"], again["structures_out"]) == (0, 7, 7)

    # alchemi inspect and export read the sharded store as one set.
    from click.testing import CliRunner

    from alchemi_core.cli import main

    shown = CliRunner().invoke(main, ["inspect", "dp.zarr", "--json"], catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.stdout)["summary"]
    assert (report["records"], report["structures"]) == (7, 7), report
    done = CliRunner().invoke(main, ["export", "dp.zarr", "all.extxyz"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    frames = ase.io.read(project / "all.extxyz", index=":")
    assert sorted(a.info["system_id"] for a in frames) == list(range(7))
