"""``alchemi run`` of a workflow with model:mace, end to end, in this plugin's environment
(issue 59, item 10: it stopped at once where alchemi-zarr was not installed)."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("ase")


def test_alchemi_run_end_to_end_with_a_mace_model_file(tmp_path, tiny_net):
    from alchemi_core.testing.workflow_run import run_workflow_cli
    from alchemi_zarr import AtomicDataZarrReader

    path = tmp_path / "tiny.model"
    torch.save(tiny_net, path)
    model = f'component = "model:mace"\nmodel_path = "{path}"\ntrust_model_file = true\ndtype = "float64"'
    summary, store = run_workflow_cli(tmp_path, model, dtype="float64")
    assert summary["structures_in"] == summary["structures_out"] == 2 and summary["every_structure_once"]
    batch = AtomicDataZarrReader(store).read_batch()
    assert batch.status.tolist() == [2, 2]
    assert math.isfinite(summary["mean_energy_per_atom_eV"])
