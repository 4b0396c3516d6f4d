"""Total charge and spin multiplicity per system: ASE in and out, batches of mixed charges,
sampler runs with refills, workflow input files, and the error a model that needs them gives."""

from __future__ import annotations

import ase.io
import pytest
import torch
from ase.build import bulk, molecule

from alchemi_core.data import AtomicData, Batch
from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import DemoDynamics, HostMemory, SizeAwareSampler
from alchemi_core.errors import InvalidDataError
from alchemi_core.models import BaseModel, ModelCard
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.workflow.inputs import read_structures


def _structures():
    """A charged doublet, a cation without spin, a neutral crystal without either."""
    oh = molecule("OH")
    oh.info.update(charge=-1, spin=2)
    nh4 = molecule("NH3")
    nh4.info["charge"] = 1.0  # an integral float is taken
    return [oh, nh4, bulk("Cu", "fcc", a=3.6, cubic=True)]


def test_charge_and_spin_round_trip_through_atomic_data_and_a_batch():
    oh, nh4, cu = _structures()
    data = AtomicData.from_atoms(oh)
    assert data.charge.tolist() == [-1] and data.spin.tolist() == [2] and data.charge.dtype == torch.long
    assert data.to_atoms().info == {"charge": -1, "spin": 2}
    assert "charge" not in AtomicData.from_atoms(cu) and "info_charge" not in AtomicData.from_atoms(oh)
    batch = Batch.from_atoms([oh, nh4, cu])
    # Those without them take charge 0 (neutral) and spin 0 ("not given", never written back).
    assert batch.charge.tolist() == [-1, 1, 0] and batch.spin.tolist() == [2, 0, 0]
    assert [a.info for a in batch.to_atoms()] == [{"charge": -1, "spin": 2}, {"charge": 1}, {"charge": 0}]
    picked = batch.index_select([2, 0])
    assert picked.charge.tolist() == [0, -1] and picked.spin.tolist() == [0, 2]


@pytest.mark.parametrize("bad", [0.5, "one", -1])
def test_a_charge_or_spin_that_is_no_integer_is_refused_naming_the_key(bad):
    atoms = molecule("OH")
    key = "spin" if bad == -1 else "charge"
    atoms.info[key] = bad
    with pytest.raises(InvalidDataError, match=rf"atoms.info\['{key}'\].*integers"):
        AtomicData.from_atoms(atoms)


def test_a_sampler_run_with_refills_keeps_each_systems_charge_and_spin():
    structures = [a.copy() for a in _structures() for _ in range(3)]
    for i, atoms in enumerate(structures):
        atoms.info["charge"] = i - 4
    data = ListDataset([AtomicData.from_atoms(a, dtype=torch.float64) for a in structures])
    sink = HostMemory(capacity=None)
    sampler = SizeAwareSampler(data, max_atoms=10, max_batch_size=2, bin_width=1)
    DemoDynamics(model=DemoModelWrapper(), n_steps=4, dt=0.5, sampler=sampler, sinks=[sink], refill_frequency=2).run()
    out = sink.read()
    assert sorted(out.system_id.tolist()) == list(range(9))
    charge = dict(zip(out.system_id.tolist(), out.charge.tolist(), strict=True))
    spin = dict(zip(out.system_id.tolist(), out.spin.tolist(), strict=True))
    assert [charge[i] for i in range(9)] == [i - 4 for i in range(9)]
    assert [spin[i] for i in range(9)] == [2, 2, 2, 0, 0, 0, 0, 0, 0]


def test_workflow_input_files_carry_charge_and_spin(tmp_path):
    ase.io.write(tmp_path / "in.extxyz", _structures()[:2])
    oh, nh4 = read_structures(str(tmp_path))
    assert (oh.charge.tolist(), oh.spin.tolist(), nh4.charge.tolist()) == ([-1], [2], [1])


class _NeedsBoth(BaseModel):
    card = ModelCard(name="omol-like", needs_charge=True, needs_spin=True)

    def forward(self, batch, compute_stress=False):
        return {"energy": torch.zeros(batch.num_graphs, 1), "forces": torch.zeros_like(batch.positions)}


def test_a_model_that_needs_charge_or_spin_names_the_field_and_the_default_to_set():
    oh, nh4, cu = _structures()
    with pytest.raises(InvalidDataError, match=r"'omol-like' needs each structure's total charge.*"
                                               r"atoms.info\['charge'\] = 0"):
        _NeedsBoth()(Batch.from_atoms([cu]))
    with pytest.raises(InvalidDataError, match=r"spin multiplicity.*atoms.info\['spin'\] = 1"):
        _NeedsBoth()(Batch.from_atoms([oh, nh4]))  # NH4+ gives no spin
    _NeedsBoth()(Batch.from_atoms([oh]))


class _PartialCharges(BaseModel):
    def forward(self, batch, compute_stress=False):
        q = batch.positions[:, 0] * 0.01
        return {"energy": torch.zeros(batch.num_graphs, 1, dtype=q.dtype), "forces": torch.zeros_like(batch.positions),
                "charges": q}


def test_partial_charges_a_model_predicts_come_back_per_atom():
    atoms = molecule("H2O")
    batch = Batch.from_atoms([atoms], dtype=torch.float64)
    batch.set_field("charges", torch.zeros(batch.num_nodes, dtype=torch.float64), "node")
    out = DemoDynamics(model=_PartialCharges(), n_steps=2, dt=0.5).run(batch)
    torch.testing.assert_close(out.charges, out.positions[:, 0] * 0.01)
    assert out.to_atoms()[0].get_charges().tolist() == pytest.approx((out.positions[:, 0] * 0.01).tolist())
