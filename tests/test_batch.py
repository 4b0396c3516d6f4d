"""Batch and AtomicData: construction, validation, and every buffer operation for every dtype."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from alchemi_core.data import AtomicData, Batch, register_field
from alchemi_core.errors import InvalidDataError
from alchemi_core.testing import make_batch, make_structure
from alchemi_core.testing.contracts import assert_same_systems


# ---------------------------------------------------------------------- AtomicData
def test_atomic_data_normalises_system_fields():
    d = AtomicData(atomic_numbers=[1, 8], positions=[[0.0, 0, 0], [1, 0, 0]], cell=torch.eye(3) * 5,
                   pbc=[True, True, False], energy=-1.5, status=0)
    assert d.cell.shape == (1, 3, 3) and d.pbc.dtype == torch.bool and d.pbc.shape == (1, 3)
    assert d.energy.shape == (1, 1) and d.status.dtype == torch.long


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(atomic_numbers=[1.0, 2.0], positions=torch.zeros(2, 3)), "integer"),
        (dict(atomic_numbers=[1, 2], positions=torch.zeros(3, 3)), r"shape \[N, 3\]"),
        (dict(atomic_numbers=[1, 2], positions=torch.tensor([[0.0, 0, 0], [math.nan, 0, 0]])), "NaN"),
        (dict(atomic_numbers=[1, 2], positions=torch.zeros(2, 3), neighbor_list=torch.tensor([[0, 1, 1], [1, 0, 0]])), r"\[2, E\]"),
        (dict(atomic_numbers=[1, 2], positions=torch.zeros(2, 3), neighbor_list=torch.tensor([[0, 5]])), "outside"),
        (dict(atomic_numbers=[1, 2], positions=torch.zeros(2, 3), cell=torch.eye(2)), "cell must hold 9"),
        (dict(atomic_numbers=[1, 2], positions=torch.zeros(2, 3), velocities=torch.zeros(3, 3)), "one row per atom"),
        (dict(atomic_numbers=[1, 2], positions=torch.zeros(2, 3), atomic_masses=torch.tensor([1.0, 0.0])), "positive"),
    ],
)
def test_atomic_data_rejects_bad_input(kwargs, message):
    with pytest.raises(InvalidDataError, match=message):
        AtomicData(**kwargs)


def test_missing_required_fields_is_a_type_error():
    with pytest.raises(TypeError, match="positions"):
        AtomicData(atomic_numbers=[1])  # type: ignore[call-arg]


def test_custom_fields_by_shape_and_registration():
    d = AtomicData(atomic_numbers=[1, 1, 8], positions=torch.zeros(3, 3), charges=torch.zeros(3), label=torch.tensor(7))
    assert d.levels["charges"].value == "node" and d.levels["label"].value == "system"
    register_field("dipole_moment", "system")
    d = AtomicData(atomic_numbers=[1, 1, 8], positions=torch.zeros(3, 3), dipole_moment=torch.zeros(3))
    assert d.dipole_moment.shape == (1, 3)


def test_ase_round_trip():
    from ase.build import bulk
    from ase.calculators.singlepoint import SinglePointCalculator

    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.set_velocities(np.full((4, 3), 0.01))
    atoms.calc = SinglePointCalculator(atoms, energy=-3.5, forces=np.ones((4, 3)), stress=np.arange(6.0))
    d = AtomicData.from_atoms(atoms, dtype=torch.float64)
    from ase import units

    assert torch.allclose(d.velocities, torch.full((4, 3), 0.01 * units.fs, dtype=torch.float64))
    back = d.to_atoms()
    assert np.allclose(back.positions, atoms.positions) and np.allclose(back.cell, atoms.cell)
    assert np.allclose(back.get_velocities(), atoms.get_velocities())
    assert back.get_potential_energy() == pytest.approx(-3.5)
    assert np.allclose(back.get_stress(voigt=True), np.arange(6.0))


# ---------------------------------------------------------------------- Batch
def test_from_data_list_offsets_neighbor_lists_and_builds_pointers():
    b = make_batch([2, 3, 1], edges=True)
    assert b.batch_ptr.tolist() == [0, 2, 5, 6]
    assert b.batch_idx.tolist() == [0, 0, 1, 1, 1, 2]
    assert b.edge_ptr.tolist() == [0, 2, 5, 5]
    assert b.neighbor_list.tolist() == [[0, 1], [1, 0], [2, 3], [3, 4], [4, 2]]
    back = b.to_data_list()
    assert back[1].neighbor_list.tolist() == [[0, 1], [1, 2], [2, 0]]


def test_from_data_list_rejects_mismatched_structures():
    a = make_structure(2)
    b = make_structure(2, dtype=torch.float64)
    with pytest.raises(InvalidDataError, match="float64"):
        Batch.from_data_list([a, b])
    c = AtomicData(atomic_numbers=[1], positions=torch.zeros(1, 3))
    with pytest.raises(InvalidDataError, match="differs from structure 0"):
        Batch.from_data_list([a, c])
    with pytest.raises(InvalidDataError, match="at least one"):
        Batch.from_data_list([])
    for items, index in (([{"positions": []}, a], 0), ([a, "H2O"], 1)):
        with pytest.raises(InvalidDataError, match=f"item {index} of data_list is a .*, not AtomicData"):
            Batch.from_data_list(items)
    # Fields in another order are the same fields.
    swapped = AtomicData(positions=a.positions, atomic_numbers=a.atomic_numbers, cell=a.cell, pbc=a.pbc)
    assert Batch.from_data_list([a, swapped]).num_graphs == 2


def test_empty_put_defrag_zero_keep_memory_and_dtypes():
    src = make_batch([3, 2, 4, 1], edges=True, extras=True)
    buf = Batch.empty(num_systems=3, num_nodes=8, num_edges=8, template=src)
    pointers = {k: buf.storage(k).data_ptr() for k in buf.keys()}
    copied = buf.put(src, torch.tensor([True, False, True, True]))
    # Systems 0 (3 atoms) and 2 (4 atoms) fit; system 3 would make 8 atoms: fits too.
    assert copied == 3 and buf.num_nodes == 8
    assert src._copied_mask.tolist() == [True, False, True, True]
    assert buf._dest_mask.tolist() == [True, True, True]
    assert_same_systems(src.index_select([0, 2, 3]), buf)
    src.defrag()
    assert src.num_graphs == 1 and src.system_id.tolist() == [1]
    buf.zero()
    assert len(buf) == 0 and all(buf.storage(k).data_ptr() == p for k, p in pointers.items())
    assert not buf.storage("frozen").any() and float(buf.storage("charges").abs().sum()) == 0.0


def test_put_stops_at_the_first_system_that_does_not_fit():
    src = make_batch([2, 5, 1])
    buf = Batch.empty(num_systems=5, num_nodes=4, num_edges=0, template=src)
    assert buf.put(src) == 1  # the 5-atom system does not fit; order is kept
    assert buf.system_id.tolist() == [0]
    assert src._copied_mask.tolist() == [True, False, False]


def test_put_rejects_a_wrong_mask_and_a_different_dtype():
    src = make_batch([2, 2])
    buf = Batch.empty(num_systems=4, num_nodes=10, template=src)
    with pytest.raises(ValueError, match=r"shape \[2\]"):
        buf.put(src, torch.tensor([True, False, True]))
    other = make_batch([2], dtype=torch.float64)
    with pytest.raises(InvalidDataError, match="positions"):
        buf.put(other)
    assert len(buf) == 0


def test_append_grows_and_index_select_orders():
    a = make_batch([2, 3], edges=True)
    b = make_batch([4], edges=True)
    b.system_id.fill_(9)
    a.append(b)
    assert a.num_graphs == 3 and a.system_id.tolist() == [0, 1, 9]
    sel = a.index_select(torch.tensor([2, 0]))
    assert sel.system_id.tolist() == [9, 0]
    assert sel.num_nodes_list == [4, 2]
    assert sel.to_data_list()[0].neighbor_list.tolist() == b.to_data_list()[0].neighbor_list.tolist()


def test_set_field_infers_level_and_copies_into_capacity():
    b = make_batch([2, 3])
    b.forces = torch.ones(5, 3)
    b.energy = torch.zeros(2, 1)
    assert b.level_of("forces").value == "node" and b.level_of("energy").value == "system"
    buf = Batch.empty(num_systems=4, num_nodes=10, template=b)
    buf.put(b)
    ptr = buf.storage("forces").data_ptr()
    buf.forces = torch.full((5, 3), 2.0)
    assert buf.storage("forces").data_ptr() == ptr and float(buf.forces.sum()) == 30.0
    with pytest.raises(InvalidDataError, match="needs 5 rows"):
        buf.forces = torch.zeros(4, 3)


def test_views_follow_the_composition():
    b = make_batch([2, 3, 1])
    pos = b.positions
    assert b.positions is pos  # cached until the composition changes
    v = b.version
    b.defrag(torch.tensor([False, True, False]))
    assert b.version > v and b.positions.shape == (3, 3)


def test_trim_and_to_and_clone():
    src = make_batch([2, 3])
    buf = Batch.empty(num_systems=8, num_nodes=50, num_edges=0, template=src)
    buf.put(src)
    buf.trim()
    assert buf.system_capacity == 2 and buf.node_capacity == 5
    c = buf.clone()
    c.positions.add_(1.0)
    assert not torch.equal(c.positions, buf.positions)
    assert_same_systems(buf, buf.to("cpu"))


def test_batch_getitem_and_from_atoms():
    from ase.build import molecule

    b = Batch.from_atoms([molecule("H2O"), molecule("CH4")], dtype=torch.float64)
    assert b.num_nodes_list == [3, 5] and b[1].atomic_numbers.tolist() == [6, 1, 1, 1, 1]
    assert len(b.to_atoms()) == 2
