"""Total charge and spin multiplicity through a Zarr store and back to ASE."""

from __future__ import annotations

import torch
from ase.build import bulk, molecule
from zarr_test_helpers import memory_url

from alchemi_core.data import Batch
from alchemi_zarr import AtomicDataZarrReader, ZarrData


def test_charge_and_spin_round_trip_through_a_store():
    oh = molecule("OH")
    oh.info.update(charge=-1, spin=2)
    nh4 = molecule("NH3")
    nh4.info["charge"] = 1
    batch = Batch.from_atoms([oh, nh4, bulk("Cu")], dtype=torch.float64)
    batch.set_field("system_id", torch.arange(3), "system")
    url = memory_url()
    ZarrData(url).write(batch)
    reader = AtomicDataZarrReader(url)
    assert reader.fields["charge"]["dtype"] == "int64"
    back = [reader[i] for i in range(3)]
    assert [int(d.charge) for d in back] == [-1, 1, 0] and [int(d.spin) for d in back] == [2, 0, 0]
    assert [{k: d.to_atoms().info[k] for k in ("charge", "spin") if k in d.to_atoms().info} for d in back] == [
        {"charge": -1, "spin": 2}, {"charge": 1}, {"charge": 0}]
