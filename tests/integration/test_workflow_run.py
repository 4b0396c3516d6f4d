"""``alchemi run WORKFLOW.toml``: the issue's file as written, validation errors, appends, sources."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("ase")
pytest.importorskip("alchemi_zarr")
pytest.importorskip("alchemi_potentials")
pytest.importorskip("alchemi_integrators")

import ase.io  # noqa: E402
from ase.build import bulk  # noqa: E402

from alchemi_core.cli import main  # noqa: E402

#: The workflow of issue 15, as written.
WORKFLOW = """\
[model]
component = "model:lennard-jones"
epsilon = 0.0104
sigma = 3.405
cutoff = 8.5125

[input]
path = "structures/*.extxyz"      # any format ASE reads, a glob, a directory, or a Zarr store

[[stage]]
component = "integrator:fire"
n_steps = 500
dt = 5.0
converge = { fmax = 0.05 }

[[stage]]
component = "integrator:langevin"
n_steps = 200
dt = 5.0
temperature = 50.0

[output]
path = "results.zarr"
"""


def _structures(folder, files=2, per_file=3, seed=0):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        frames = []
        for i in range(per_file):
            atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((2, 2, 2))
            atoms.positions += rng.normal(scale=0.05, size=atoms.positions.shape)
            atoms.info["config_type"] = f"rattled-{f}-{i}"
            frames.append(atoms)
        ase.io.write(folder / f"ar{f}.extxyz", frames)


def _invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture
def project(tmp_path, monkeypatch):
    _structures(tmp_path / "structures")
    (tmp_path / "workflow.toml").write_text(WORKFLOW)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_issue_workflow_runs_as_written(project):
    from alchemi_zarr import AtomicDataZarrReader

    result = _invoke("run", "workflow.toml", "--json", "--device", "cpu")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["structures_in"] == summary["structures_out"] == 6 and summary["every_structure_once"]
    reader = AtomicDataZarrReader(project / "results.zarr")
    batch = reader.read_batch()
    assert sorted(batch.system_id.tolist()) == list(range(6))
    assert (batch.status == 2).all()  # both stages done
    atoms = [reader[i].to_atoms() for i in range(len(reader))]
    sources = sorted((a.info["source_file"], a.info["source_index"]) for a in atoms)
    assert sources == [(f"structures/ar{f}.extxyz", i) for f in range(2) for i in range(3)]
    by_source = {(a.info["source_file"], a.info["source_index"]): a for a in atoms}
    assert by_source[("structures/ar1.extxyz", 2)].info["config_type"] == "rattled-1-2"
    # The log has every stage, in fs and K.
    from alchemi_core.workflow.logs import read_log

    log = read_log(project / "results.log.csv")
    assert set(np.unique(np.asarray(log["stage"]))) == {0, 1}
    stages = np.asarray(log["stage"])
    names = np.asarray(log["stage_name"]).astype(str)
    assert {int(s): n for s, n in zip(stages, names)} == {0: "FIRE", 1: "Langevin"}
    md = np.asarray(log["stage"]) == 1
    assert np.asarray(log["time"])[md].max() == pytest.approx(200 * 5.0)


def test_structures_read_by_worker_processes_give_the_same_results(project):
    from alchemi_zarr import AtomicDataZarrReader

    with_workers = WORKFLOW.replace('path = "results.zarr"', 'path = "workers.zarr"') + "\n[sampler]\nworkers = 2\n"
    (project / "workers.toml").write_text(with_workers)
    for name in ("workflow.toml", "workers.toml"):
        result = _invoke("run", name, "--no-progress", "--device", "cpu")
        assert result.exit_code == 0, result.output
    plain = AtomicDataZarrReader(project / "results.zarr").read_batch()
    built = AtomicDataZarrReader(project / "workers.zarr").read_batch()
    assert plain.system_id.tolist() == built.system_id.tolist() and built.num_graphs == 6
    assert np.array_equal(plain.positions.numpy(), built.positions.numpy())


def test_a_rerun_into_its_store_stores_nothing_twice_and_fresh_starts_over(project):
    from alchemi_zarr import AtomicDataZarrReader

    first = _invoke("run", "workflow.toml", "--no-progress")
    assert first.exit_code == 0 and "stored 6; 0 were already in the store" in first.output, first.output
    again = _invoke("run", "workflow.toml", "--no-progress")
    assert again.exit_code == 0 and "stored 0; 6 were already in the store" in again.output, again.output
    assert "(each exactly once)" in again.output
    ids = AtomicDataZarrReader(project / "results.zarr").read_batch().system_id.tolist()
    assert sorted(ids) == list(range(6))
    fresh = _invoke("run", "workflow.toml", "--no-progress", "--fresh", "--json")
    assert fresh.exit_code == 0, fresh.output
    assert (json.loads(fresh.stdout)["written"], json.loads(fresh.stdout)["already_stored"]) == (6, 0)
    ids = AtomicDataZarrReader(project / "results.zarr").read_batch().system_id.tolist()
    assert sorted(ids) == list(range(6))


def test_a_store_of_another_input_is_refused_naming_fresh(project):
    assert _invoke("run", "workflow.toml", "--no-progress").exit_code == 0
    (project / "structures" / "ar1.extxyz").unlink()  # the input is now 3 structures
    refused = _invoke("run", "workflow.toml", "--no-progress")
    assert refused.exit_code == 2, refused.output
    assert "output.path" in refused.output and "--fresh" in refused.output


def test_dry_run_prints_the_plan_and_runs_nothing(project):
    result = _invoke("run", "workflow.toml", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    assert [s["component"] for s in plan["stages"]] == ["integrator:fire", "integrator:langevin"]
    assert plan["stages"][0]["converge"] == {"fmax": 0.05}
    assert not (project / "results.zarr").exists()
    text = _invoke("run", "workflow.toml", "--dry-run").stdout
    assert "stage 1  integrator:langevin" in text


@pytest.mark.parametrize(
    ("old", "new", "key", "hint"),
    [
        ('component = "integrator:langevin"', 'component = "integrator:langevine"', "stage[1].component", "langevin"),
        ("temperature = 50.0", 'temperature = "hot"', "stage[1].temperature", "must be a number"),
        ("n_steps = 500", "n_steps = 500.5", "stage[0].n_steps", "must be an integer"),
        ("n_steps = 200", "n_stepz = 200", "stage[1].n_stepz", "did you mean 'n_steps'"),
        ("cutoff = 8.5125", "", "model.cutoff", "missing"),
        ('path = "results.zarr"', 'pth = "results.zarr"', "output.pth", ""),
        ('component = "model:lennard-jones"', 'component = "integrator:fire"', "model.component", "not a model"),
        ("converge = { fmax = 0.05 }", "converge = { fmax = -1 }", "stage[0].converge.fmax", "positive"),
        ('path = "structures/*.extxyz"', 'path = "nowhere/*.xyz"', "input.path", "matches no files"),
        ("dt = 5.0\nconverge", "dt = -5.0\nconverge", "stage[0]", "dt"),
        ('path = "results.zarr"\n', 'path = "results.zarr"\n[sampler]\nworkers = -1\n', "sampler.workers", ">= 0"),
    ],
)
def test_a_malformed_workflow_is_one_line_naming_the_key_with_status_2(project, old, new, key, hint):
    assert old in WORKFLOW
    (project / "bad.toml").write_text(WORKFLOW.replace(old, new, 1))
    result = _invoke("run", "bad.toml", "--no-progress")
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"bad.toml: {key}" in err and hint in err, err
    assert not (project / "results.zarr").exists()


def test_missing_sections_and_bad_toml_are_named(project):
    (project / "bad.toml").write_text(WORKFLOW.split("[input]")[0])
    result = _invoke("run", "bad.toml")
    assert result.exit_code == 2 and "stage" in result.stderr and "[[stage]]" in result.stderr
    (project / "bad.toml").write_text("[model\n")
    result = _invoke("run", "bad.toml")
    assert result.exit_code == 2 and "not valid TOML" in result.stderr
    result = _invoke("run", "missing.toml")
    assert result.exit_code == 2 and "cannot read" in result.stderr


def test_a_workflow_cannot_name_an_import_path(project):
    (project / "bad.toml").write_text(WORKFLOW.replace('"model:lennard-jones"', '"os:system"'))
    result = _invoke("run", "bad.toml")
    assert result.exit_code == 2 and "model.component" in result.stderr
    (project / "bad.toml").write_text(WORKFLOW.replace('"model:lennard-jones"', '"model:os.system"'))
    result = _invoke("run", "bad.toml")
    assert result.exit_code == 2 and "no component" in result.stderr


def test_stage_hooks_are_named_through_the_registry(project):
    extra = '\n[[stage.hook]]\ncomponent = "hook:max-force-clamp"\nmax_force = 5.0\n'
    text = WORKFLOW.replace("temperature = 50.0\n", "temperature = 50.0\n" + extra)
    (project / "hooked.toml").write_text(text)
    result = _invoke("run", "hooked.toml", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    assert plan["stages"][1]["hooks"] == [{"component": "hook:max-force-clamp", "max_force": 5.0}]
    (project / "bad.toml").write_text(text.replace("max_force = 5.0", "max_forse = 5.0"))
    result = _invoke("run", "bad.toml")
    assert result.exit_code == 2 and "stage[1].hook[0].max_forse" in result.stderr


def test_execute_runs_a_plan_over_any_dataset_into_any_sink():
    from alchemi_core.data import AtomicData
    from alchemi_core.data.datapipes import ListDataset
    from alchemi_core.dynamics import HostMemory
    from alchemi_core.workflow import build_plan, execute, parse_workflow

    no_io = re.sub(r"\[input\]\n[^\[]*", "", WORKFLOW).split("[output]")[0]
    plan = build_plan(parse_workflow(no_io), device="cpu")
    cells = [AtomicData.from_atoms(bulk("Ar", "fcc", a=5.3, cubic=True).repeat(2)) for _ in range(3)]
    sink = HostMemory(capacity=None)
    summary = execute(plan, ListDataset(cells), [sink], progress=False)
    assert summary.structures_out == 3 == len(sink)
    assert sorted(sink.read().system_id.tolist()) == [0, 1, 2]
    # The same plan runs again over another shard.
    summary = execute(plan, ListDataset(cells[:2]), [sink], progress=False)
    assert summary.structures_out == 2 and len(sink) == 5


def test_trajectories_are_stored_inspected_and_exported_whole(project):
    from alchemi_core.workflow.results import store_summary, structure_table

    text = WORKFLOW.replace('path = "results.zarr"', 'path = "results.zarr"\ntrajectory_every = 50')
    text += '\n[checkpoint]\npath = "run.ckpt"\nevery = 100\n'
    (project / "traj.toml").write_text(text)
    result = _invoke("run", "traj.toml", "--json", "--no-progress")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["structures_out"] == 6 and summary["every_structure_once"]  # frames are not finished structures
    assert (project / "run.ckpt").exists()
    table = structure_table("results.zarr")
    assert len(table) == 6 and all(r["frames"] > 1 and r["status"] == 2 for r in table)
    assert store_summary("results.zarr")["records"] == sum(r["frames"] for r in table)
    result = _invoke("export", "results.zarr", "all.traj", "--frames", "all", "--json")
    assert result.exit_code == 0, result.output
    frames = ase.io.read(project / "all.traj", index=":")
    assert len(frames) == sum(r["frames"] for r in table)
    ids = [a.info["system_id"] for a in frames]
    assert ids == sorted(ids)  # grouped by structure, each structure's frames in the order stored
    result = _invoke("export", "results.zarr", "last.extxyz")
    last = ase.io.read(project / "last.extxyz", index=":")
    assert result.exit_code == 0 and len(last) == 6 and {a.info["status"] for a in last} == {2}
    result = _invoke("inspect", "results.zarr", "--json")
    assert json.loads(result.stdout)["summary"]["structures"] == 6


def test_plots_name_each_stage_from_the_log(tmp_path):
    """A log's stage_name column labels the plotted stages ("FIRE (stage 0)"); a log without
    names (written by an older alchemi) falls back to the index."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from alchemi_core.workflow.logs import LogCollector, read_log
    from alchemi_core.workflow.results import _draw

    path = tmp_path / "run.log.csv"
    log = LogCollector(path)
    log.name_stage(0, "FIRE")
    log.name_stage(1, "Langevin")
    for stage in (0, 1):
        for step in range(3):
            log.receive(stage, {"step": np.array([step, step]), "system_id": np.array([0, 1]),
                                "time": np.array([5.0 * step] * 2), "energy": np.array([-1.0 - step, -2.0])})
    log.close()
    table = read_log(path)
    cols = {k: np.asarray(table[k]) for k in table}
    for columns, expected in ((cols, ["FIRE (stage 0)", "Langevin (stage 1)"]),
                              ({k: v for k, v in cols.items() if k != "stage_name"}, ["stage 0", "stage 1"])):
        fig, ax = plt.subplots()
        assert _draw(ax, "energy", columns, None, {0: 2, 1: 2})
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        plt.close(fig)
        assert [lab.split(":")[0] for lab in labels[::2]] == expected


def test_plots_add_pressure_and_volume_where_the_log_has_them(tmp_path):
    """An NPT stage's rows carry pressure and volume, a FIRE stage's leave them empty: the plots
    add pressure.png and volume.png from the NPT rows; a log without them gets neither."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("alchemi_zarr")
    import torch

    from alchemi_core.data import AtomicData
    from alchemi_core.workflow.logs import LogCollector
    from alchemi_core.workflow.results import _draw, plot_results
    from alchemi_zarr import AtomicDataZarrWriter

    store = tmp_path / "results.zarr"
    AtomicDataZarrWriter(store).write([AtomicData(atomic_numbers=torch.full((4,), 18), positions=torch.rand(4, 3),
                                                  energy=torch.tensor([[-1.0]])) for _ in range(2)])
    for with_pressure in (True, False):
        path = tmp_path / f"run{with_pressure}.log.csv"
        log = LogCollector(path)
        for stage in (0, 1):
            for step in range(4):
                cols = {"step": np.array([step, step]), "system_id": np.array([0, 1]),
                        "time": np.array([5.0 * step] * 2), "energy": np.array([-1.0 - step, -2.0]),
                        "temperature": np.array([50.0, 60.0]), "fmax": np.array([0.1, 0.2])}
                if stage == 1 and with_pressure:
                    cols |= {"volume": np.array([160.0 + step, 170.0]), "pressure": np.array([1e-3 * step, -2e-3])}
                log.receive(stage, cols)
        log.close()
        plots = plot_results(store, tmp_path / f"plots{with_pressure}", log=path)
        names = sorted(p.name for p in plots)
        extra = ["pressure.png", "volume.png"] if with_pressure else []
        assert names == sorted(["energy.png", "fmax.png", "temperature.png", "throughput.png", *extra])
        for p in plots:
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.pyplot as plt

    from alchemi_core.units import EV_PER_A3_TO_GPA
    from alchemi_core.workflow.logs import read_log

    table = read_log(tmp_path / "runTrue.log.csv")
    fig, ax = plt.subplots()
    assert _draw(ax, "pressure", {k: np.asarray(table[k]) for k in table}, None, {0: 4, 1: 4})
    (line,) = ax.get_lines()  # only the NPT stage
    np.testing.assert_allclose(line.get_ydata(), [(1e-3 * s - 2e-3) / 2 * EV_PER_A3_TO_GPA for s in range(4)])
    plt.close(fig)
