"""Damaged stores fail with InvalidDataError naming the array and the damage, before anything is
appended (finding 7 of issue 13: some were appended to, others failed with a raw IndexError,
KeyError or JSONDecodeError)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr
from zarr_test_helpers import batch_for

from alchemi_core.errors import InvalidDataError
from alchemi_zarr import AtomicDataZarrReader, ZarrData


def _fingerprint(root: Path) -> dict[str, str]:
    files = (p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _garble(path: Path) -> None:
    path.write_text('{"zarr_format": 3, "node_type": "arr')


def _commit_past_pointers(root: Path) -> None:
    zarr.open_group(str(root), mode="a")["commit"][:] = np.array([50, 10**6, 0])


def _garble_commit_chunk(root: Path) -> None:
    (root / "commit" / "c" / "0").write_bytes(b"not a zstd frame")


def _lose_commit(root: Path) -> None:
    shutil.rmtree(root / "commit")


def _lose_field(root: Path) -> None:
    shutil.rmtree(root / "systems" / "energy")


def _pointers_fall(root: Path) -> None:
    ptr = zarr.open_group(str(root), mode="a")["atom_ptr"]
    values = np.asarray(ptr[:4])
    ptr[1] = values[2] + 1  # rises past the next entry, then falls back to it


def _wrong_row_shape(root: Path) -> None:
    group = zarr.open_group(str(root), mode="a")
    rows = group["atoms/positions"].shape[0]
    del group["atoms/positions"]
    group.create_array("atoms/positions", shape=(rows, 2), dtype="float32")


DAMAGE = {
    "garbled array metadata": (lambda r: _garble(r / "atoms" / "positions" / "zarr.json"), "atoms/positions"),
    "commit past the pointers": (_commit_past_pointers, "atom_ptr"),
    "commit lost": (_lose_commit, "commit"),
    "commit chunk garbled": (_garble_commit_chunk, "commit"),
    "field array lost": (_lose_field, "systems/energy"),
    "pointers that fall": (_pointers_fall, "atom_ptr"),
    "wrong row shape": (_wrong_row_shape, "atoms/positions"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_store_is_refused_by_name_before_any_append(tmp_path, damage):
    root = tmp_path / "store.zarr"
    ZarrData(str(root)).write(batch_for([0, 1, 2]))
    do, array = DAMAGE[damage]
    do(root)
    before = _fingerprint(root)
    with pytest.raises(InvalidDataError, match="damaged") as err:
        sink = ZarrData(str(root))
        sink.write(batch_for([3]))
    assert repr(array) in str(err.value), str(err.value)
    assert _fingerprint(root) == before, "the damaged store was changed"
    with pytest.raises(InvalidDataError):
        AtomicDataZarrReader(str(root)).read_batch()


def test_a_garbled_group_metadata_file_is_invalid_data_not_a_json_error(tmp_path):
    root = tmp_path / "store.zarr"
    ZarrData(str(root)).write(batch_for([0, 1]))
    _garble(root / "zarr.json")
    with pytest.raises(InvalidDataError, match="zarr.json"):
        ZarrData(str(root))
    with pytest.raises(InvalidDataError, match="zarr.json"):
        AtomicDataZarrReader(str(root))
