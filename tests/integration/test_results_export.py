"""What ``alchemi export``/``inspect`` and ``export_structures`` give a user (issue 59, findings
6, 8 and 10): structures in input order (or the order stored, on request), no engine state in
``info``, a store holding a structure twice refused, and a data-parallel run's store read as one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

pytest.importorskip("ase")
pytest.importorskip("alchemi_zarr")
pytest.importorskip("alchemi_potentials")
pytest.importorskip("alchemi_integrators")

import ase.io  # noqa: E402

from alchemi_core import registry  # noqa: E402
from alchemi_core.cli import main  # noqa: E402
from alchemi_core.data import Batch  # noqa: E402
from alchemi_core.errors import ConfigurationError, InvalidDataError  # noqa: E402
from alchemi_core.testing import make_batch, rattled_argon  # noqa: E402
from alchemi_core.workflow.results import export_structures, store_summary, structure_table  # noqa: E402
from alchemi_zarr import ShardedZarrStore, ZarrData  # noqa: E402


def _records(ids: list[int], status: int, steps: int, size: int = 2):
    batch = make_batch([size + i for i in ids], system_ids=False)
    batch.set_field("system_id", torch.tensor(ids), "system")
    batch.set_field("status", torch.full((len(ids),), status), "system")
    batch.set_field("stage_steps", torch.full((len(ids),), steps), "system")
    return batch


def _finished_out_of_order(sink) -> None:
    """Frames (status 0) of 0, 1, 2; then 2 and 0 finish (status 1), then a frame of 1, then 1."""
    sink.write(_records([0, 1, 2], 0, 10))
    sink.write(_records([2, 0], 1, 20))
    sink.write(_records([1], 0, 20))
    sink.write(_records([1], 1, 30))


def _ids(path) -> list[int]:
    return [int(a.info["system_id"]) for a in ase.io.read(path, index=":")]


def test_export_writes_input_order_unless_asked_for_the_stored_order(tmp_path):
    store = tmp_path / "r.zarr"
    _finished_out_of_order(ZarrData(store))
    out = tmp_path / "last.extxyz"
    assert export_structures(store, out) == 3
    frames = ase.io.read(out, index=":")
    assert _ids(out) == [0, 1, 2] and {a.info["status"] for a in frames} == {1}
    assert [len(a) for a in frames] == [2, 3, 4]  # each structure's own atoms
    export_structures(store, out, order="stored")
    assert _ids(out) == [2, 0, 1]
    export_structures(store, out, frames="all")
    assert _ids(out) == [0, 0, 1, 1, 1, 2, 2]
    export_structures(store, out, frames="all", order="stored")
    assert _ids(out) == [2, 2, 0, 0, 1, 1, 1]
    statuses = [int(a.info["status"]) for a in ase.io.read(out, index=":")]
    assert statuses == [0, 1, 0, 1, 0, 0, 1]  # each structure's frames in the order stored
    result = CliRunner().invoke(main, ["export", str(store), str(out), "--order", "stored"])
    assert result.exit_code == 0, result.output
    assert _ids(out) == [2, 0, 1]
    with pytest.raises(ConfigurationError, match="order must be one of"):
        export_structures(store, out, order="completion")


def test_exported_atoms_carry_no_engine_state(tmp_path):
    model = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5125)
    store = tmp_path / "relaxed.zarr"
    sink = ZarrData(store)
    relax = registry.build("integrator:fire", model=model, n_steps=30, dt=5.0, cell_filter="frechet")
    sink.write(relax.run(Batch.from_atoms(rattled_argon(3, 0.05, 0.02), dtype=torch.float64)))
    stored = set(ZarrData(store).reader().fields)
    assert {"fire_dt", "fire_alpha", "cell_filter_dof", "cell_filter_velocity", "stage_steps"} <= stored  # kept
    out = tmp_path / "relaxed.extxyz"
    assert export_structures(store, out) == 3
    for atoms in [*ase.io.read(out, index=":"), ZarrData(store).reader()[0].to_atoms()]:
        assert not set(atoms.info) & registry.engine_state_fields(), sorted(atoms.info)
        assert {"system_id", "status"} <= set(atoms.info)


def test_a_store_holding_a_structure_twice_is_refused_by_inspect_and_export(tmp_path):
    store = tmp_path / "twice.zarr"
    sink = ZarrData(store)
    sink.write(_records([0, 1], 1, 5))
    sink.write(_records([2], 1, 5))
    sink.write(_records([0], 1, 5))  # stored again, as a rerun into the same store did
    for call in (lambda: structure_table(store), lambda: store_summary(store),
                 lambda: export_structures(store, tmp_path / "out.extxyz")):
        with pytest.raises(InvalidDataError, match=r"stored twice.*system_id 0 at records \[0, 3\]"):
            call()
    result = CliRunner().invoke(main, ["export", str(store), str(tmp_path / "out.extxyz")])
    assert result.exit_code != 0 and "system_id 0 at records [0, 3]" in result.output
    result = CliRunner().invoke(main, ["inspect", str(store)])
    assert result.exit_code != 0 and str(store) in result.output


def test_inspect_and_export_read_a_sharded_store_as_one_set(tmp_path):
    root = tmp_path / "campaign.zarr"
    results = ShardedZarrStore(root)
    results.sink(0).write(_records([3, 0], 1, 4))
    results.sink(1).write(_records([1, 2], 1, 4))
    result = CliRunner().invoke(main, ["inspect", str(root), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    assert summary["structures"] == 4 and summary["store"] == str(root)
    out = tmp_path / "all.extxyz"
    result = CliRunner().invoke(main, ["export", str(root), str(out)])
    assert result.exit_code == 0, result.output
    assert _ids(out) == [0, 1, 2, 3]
    assert ZarrData(root).read().system_id.tolist() == [3, 0, 1, 2]


WORKFLOW = """\
model = {{ component = "model:lennard-jones", epsilon = 0.0104, sigma = 3.405, cutoff = 8.5125 }}
input = {{ path = "cells.extxyz" }}
stage = [{{ component = "integrator:fire", n_steps = 5, dt = 5.0 }}]
output = {{ path = "{out}" }}
"""


def _a_file(tmp_path: Path) -> Path:
    (tmp_path / "results.zarr").write_text("a file")
    return tmp_path / "results.zarr"


def _a_folder_of_user_files(tmp_path: Path) -> Path:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("my notes")
    return tmp_path / "mine"


@pytest.mark.parametrize(("make", "says"), [
    (_a_file, "is a file, not a folder"),
    (lambda tmp_path: Path("/proc/no-such-dir/results.zarr"), "cannot create the store folder"),
    (_a_folder_of_user_files, "holds other files (notes.txt)"),
])
def test_a_bad_output_path_is_named_by_its_key_with_what_to_do(tmp_path, monkeypatch, make, says):
    from alchemi_core.workflow.data_parallel import sharded_output
    from alchemi_core.workflow.spec import WorkflowError, load_workflow

    monkeypatch.chdir(tmp_path)
    ase.io.write("cells.extxyz", rattled_argon(2, 0.05, 0.01))
    out = make(tmp_path)
    (tmp_path / "wf.toml").write_text(WORKFLOW.format(out=out))
    result = CliRunner().invoke(main, ["run", "wf.toml", "--no-progress"])
    assert result.exit_code != 0
    text = " ".join(result.output.split())
    assert "wf.toml: output" in text and str(out) in text and says in text, text
    assert "path" in text.split(says)[1] and "Error:" not in text and "Errno" not in text, text
    with pytest.raises(WorkflowError, match=rf"output.path: .*{re.escape(says)}"):  # the data-parallel run's store
        sharded_output(load_workflow("wf.toml"))
