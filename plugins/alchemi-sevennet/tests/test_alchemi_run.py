"""``alchemi run`` of a workflow with model:sevennet, end to end, in this plugin's environment
(issue 59, item 10: it stopped at once where alchemi-zarr was not installed)."""

from __future__ import annotations

import pytest

pytest.importorskip("ase")


def test_alchemi_run_end_to_end_with_7net_0(tmp_path):
    from alchemi_core.testing.workflow_run import run_workflow_cli
    from alchemi_zarr import AtomicDataZarrReader

    summary, store = run_workflow_cli(tmp_path, 'component = "model:sevennet"\nmodel = "7net-0"')
    assert summary["structures_in"] == summary["structures_out"] == 2 and summary["every_structure_once"]
    batch = AtomicDataZarrReader(store).read_batch()
    assert batch.status.tolist() == [2, 2]
    # 7net-0's silicon: about -5.4 eV per atom near the diamond minimum.
    assert -6.0 < summary["mean_energy_per_atom_eV"] < -4.5
