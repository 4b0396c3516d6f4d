"""``alchemi run`` of a workflow with model:orb, end to end, in this plugin's environment: a
weights file of a published architecture (random weights, saved as orb-models saves its models)."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("ase")


def test_alchemi_run_end_to_end_with_an_orb_weights_file(tmp_path):
    from orb_models.forcefield import pretrained

    from alchemi_core.testing.workflow_run import run_workflow_cli
    from alchemi_zarr import AtomicDataZarrReader

    path = tmp_path / "orb-v3-direct-20-omat.ckpt"
    torch.manual_seed(0)
    torch.save(pretrained.orb_v3_direct_architecture(device="cpu").state_dict(), path)
    model = f'component = "model:orb"\nmodel = "{path}"\narchitecture = "orb-v3-direct-20-omat"'
    summary, store = run_workflow_cli(tmp_path, model)
    assert summary["structures_in"] == summary["structures_out"] == 2 and summary["every_structure_once"]
    batch = AtomicDataZarrReader(store).read_batch()
    assert batch.status.tolist() == [2, 2]
    assert math.isfinite(summary["mean_energy_per_atom_eV"])
