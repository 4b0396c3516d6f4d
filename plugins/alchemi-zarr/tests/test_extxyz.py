"""Export to extended XYZ round-trips through ase.io.read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

ase_io = pytest.importorskip("ase.io")

from zarr_test_helpers import memory_url  # noqa: E402

from alchemi_core.data import AtomicData, Batch  # noqa: E402
from alchemi_core.errors import InvalidDataError  # noqa: E402
from alchemi_zarr import AtomicDataZarrReader, ZarrData, export_extxyz  # noqa: E402


def labelled_batch() -> Batch:
    structures = []
    for s, n in enumerate([3, 5, 2]):
        g = torch.Generator().manual_seed(s)
        a = torch.randn(3, 3, generator=g, dtype=torch.float64)
        structures.append(
            AtomicData(
                atomic_numbers=torch.randint(1, 30, (n,), generator=g),
                positions=torch.randn(n, 3, generator=g, dtype=torch.float64) * 2,
                cell=torch.eye(3, dtype=torch.float64) * 8 + 0.1 * a,
                pbc=torch.tensor([True, True, s == 0]),
                energy=torch.randn(1, 1, generator=g, dtype=torch.float64),
                forces=torch.randn(n, 3, generator=g, dtype=torch.float64),
                stress=(a + a.T) / 2,  # physical stress is symmetric
                charges=torch.randn(n, generator=g, dtype=torch.float64),
                frozen=torch.tensor([True] + [False] * (n - 1)),
                levels={"charges": "node", "frozen": "node"},
            )
        )
    batch = Batch.from_data_list(structures)
    batch.set_field("system_id", torch.tensor([40, 41, 42]), "system")
    batch.set_field("status", torch.tensor([2, 2, 1]), "system")
    return batch


def test_extxyz_export_round_trips_through_ase(tmp_path):
    batch = labelled_batch()
    sink = ZarrData(memory_url())
    sink.write(batch)
    path = tmp_path / "out.extxyz"
    assert sink.to_extxyz(path) == 3
    frames = ase_io.read(str(path), index=":")
    assert len(frames) == 3
    for atoms, data in zip(frames, batch.to_data_list()):
        np.testing.assert_array_equal(atoms.numbers, data.atomic_numbers.numpy())
        np.testing.assert_allclose(atoms.positions, data.positions.numpy(), rtol=0, atol=1e-7)  # extxyz keeps 8 decimals
        np.testing.assert_allclose(atoms.cell.array, data.cell[0].numpy(), atol=1e-7)
        np.testing.assert_array_equal(atoms.pbc, data.pbc[0].numpy())
        assert atoms.get_potential_energy() == pytest.approx(float(data.energy), abs=1e-10)
        np.testing.assert_allclose(atoms.get_forces(apply_constraint=False), data.forces.numpy(), atol=1e-7)
        np.testing.assert_allclose(atoms.get_stress(voigt=False), data.stress[0].numpy(), atol=1e-7)
        assert atoms.info["system_id"] == int(data.system_id) and atoms.info["status"] == int(data.status)
        # ASE reads a per-atom "charges" column back as the calculator's charges.
        np.testing.assert_allclose(atoms.get_charges(), data.charges.numpy(), atol=1e-7)
        # Frozen atoms come back as ASE's FixAtoms.
        assert atoms.constraints[0].get_indices().tolist() == np.nonzero(data.frozen.numpy())[0].tolist()


def test_export_streams_in_blocks_and_takes_a_range(tmp_path):
    batch = labelled_batch()
    url = memory_url()
    ZarrData(url).write(batch)
    path = tmp_path / "part.extxyz"
    assert export_extxyz(url, path, start=1, block_size=1) == 2
    frames = ase_io.read(str(path), index=":")
    assert [a.info["system_id"] for a in frames] == [41, 42]
    # Exporting again replaces the file rather than appending to it.
    assert AtomicDataZarrReader(url).to_extxyz(path, exclude=["charges"]) == 3
    frames = ase_io.read(str(path), index=":")
    assert len(frames) == 3 and "charges" not in frames[0].calc.results and frames[0].constraints


def test_complex_fields_are_refused_by_name(tmp_path):
    data = AtomicData(atomic_numbers=[1, 1], positions=torch.zeros(2, 3),
                      wave=torch.ones(2, dtype=torch.complex64), levels={"wave": "node"})
    url = memory_url()
    ZarrData(url).write(Batch.from_data_list([data]))
    with pytest.raises(InvalidDataError, match="'wave' is complex"):
        export_extxyz(url, tmp_path / "c.extxyz")
    assert export_extxyz(url, tmp_path / "c.extxyz", exclude=["wave"]) == 1
