"""The sampler takes what ``Batch.from_atoms`` takes (issue 59, item 10): structures whose
``atoms.info`` keys or atom arrays differ run together, each keeping its own values; and
``Batch.from_atoms`` takes a single ``Atoms``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("ase")

from ase.build import bulk  # noqa: E402
from ase.spacegroup import crystal  # noqa: E402

from alchemi_core.data import AtomicData, Batch  # noqa: E402
from alchemi_core.data.datapipes import ListDataset  # noqa: E402
from alchemi_core.dynamics import DemoDynamics, HostMemory, SizeAwareSampler  # noqa: E402
from alchemi_core.models.demo import DemoModelWrapper  # noqa: E402


def _mixed():
    """Six structures: a crystal() cell (info spacegroup, unit_cell), Fe with initial_magmoms,
    and argon cells with a numeric info key of two shapes and none."""
    out = [crystal("Ar", [(0, 0, 0)], spacegroup=225, cellpar=[5.26] * 3 + [90] * 3), bulk("Fe")]
    for i in range(4):
        atoms = bulk("Ar", "fcc", a=5.26 + 0.01 * i, cubic=True)
        if i == 1:
            atoms.info["weight"] = 2.0
        if i == 2:
            atoms.info["weight"] = [1.0, 2.0]
        out.append(atoms)
    return out


def test_the_sampler_runs_structures_whose_info_and_arrays_differ():
    atoms = _mixed()
    data = ListDataset([AtomicData.from_atoms(a, dtype=torch.float64) for a in atoms])
    sampler = SizeAwareSampler(data, max_atoms=12, max_batch_size=2, bin_width=1)
    sink = HostMemory(capacity=None)
    stage = DemoDynamics(model=DemoModelWrapper(), n_steps=4, dt=0.5, sampler=sampler, sinks=[sink],
                         refill_frequency=2)
    stage.run()
    out = sink.read()
    assert sorted(out.system_id.tolist()) == list(range(6))  # several refills: max 2 at a time
    back = dict(zip(out.system_id.tolist(), out.to_atoms(), strict=True))
    expected = Batch.from_atoms(atoms, dtype=torch.float64).to_atoms()
    for i, ref in enumerate(expected):
        got = back[i]
        assert got.get_chemical_symbols() == ref.get_chemical_symbols()
        for key in ("spacegroup", "unit_cell", "weight"):
            assert (key in got.info) == (key in ref.info) == (key in atoms[i].info), (i, key)
            if key in ref.info:
                assert str(got.info[key]) == str(ref.info[key]), (i, key)
    np.testing.assert_allclose(back[1].get_initial_magnetic_moments(), atoms[1].get_initial_magnetic_moments())
    assert not back[2].get_initial_magnetic_moments().any()


def test_a_dataset_over_a_plain_list_takes_them_too():
    from alchemi_core.data.datapipes import Dataset

    atoms = _mixed()
    sampler = SizeAwareSampler(Dataset([AtomicData.from_atoms(a) for a in atoms]), max_atoms=100)
    batch = sampler.build_initial_batch()
    assert batch.num_graphs == len(atoms)
    back = dict(zip(batch.system_id.tolist(), batch.to_atoms(), strict=True))
    def weight(a):
        w = a.info.get("weight")
        return None if w is None else np.asarray(w, dtype=float).tolist()

    assert [weight(back[i]) for i in range(len(atoms))] == [weight(a) for a in atoms] == [None, None, None, 2.0,
                                                                                           [1.0, 2.0], None]


def test_the_dataset_keeps_structures_that_already_batch_together_as_they_are():
    same = [AtomicData.from_atoms(bulk("Ar", "fcc", a=5.26, cubic=True)) for _ in range(3)]
    data = ListDataset(same)
    assert all(data.get_stored(i) is same[i] for i in range(3))


def test_batch_from_atoms_takes_a_single_atoms():
    atoms = bulk("Fe", cubic=True)
    one = Batch.from_atoms(atoms)
    assert one.num_graphs == 1 and one.num_nodes == len(atoms)
    assert one.atomic_numbers.tolist() == atoms.numbers.tolist()
    np.testing.assert_allclose(one.to_atoms()[0].positions, atoms.positions, atol=1e-6)
