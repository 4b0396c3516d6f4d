"""What a stored record must hold to read back as a structure: the checks ``AtomicData`` makes of
a new structure, on the records of a store, vectorised over many records at once.

A store can be crafted or damaged, so ``reader[i]``, ``read_batch`` and ``ZarrData.read()`` go
through :func:`check_records` and name the first record that fails (its index, ``system_id`` and
status). The checks run when records are read, never inside a step.

Example:
    >>> import numpy as np, torch
    >>> fields = {"atomic_numbers": torch.tensor([1, -3]), "positions": torch.zeros(2, 3)}
    >>> try:
    ...     check_records(fields, np.array([1, 1]), np.array([0, 0]), 0, "memory://doc")
    ... except Exception as exc:
    ...     print(str(exc).split(";")[0])
    record 1 of memory://doc is not a valid structure: atomic number -3 at atom 0 (atomic numbers are 0 or more)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from alchemi_core.data.values import FINITE_FIELDS
from alchemi_core.errors import InvalidDataError

#: Fields every structure has (``AtomicData`` requires them).
REQUIRED = ("atomic_numbers", "positions")


def check_records(
    fields: Mapping[str, torch.Tensor], num_atoms: np.ndarray, num_edges: np.ndarray, first: int, where: str
) -> None:
    """Raise for the first of these records that is not a valid structure.

    Args:
        fields: The records' rows of every field, concatenated (atom indices local to each record).
        num_atoms: Atoms of each record.
        num_edges: Edges of each record.
        first: The store index of the first record (for the message).
        where: The store (for the message).

    Raises:
        InvalidDataError: A missing atomic_numbers or positions field, atomic numbers that are not
            non-negative integers, non-finite positions, velocities or cell, masses that are not
            finite and positive, or neighbour indices outside their record.
    """
    missing = [name for name in REQUIRED if name not in fields]
    if missing:
        raise InvalidDataError(
            f"{where} holds records without {missing}, so they are not structures; read its columns "
            "with store.read_rows(name, start, stop) instead"
        )
    atom_owner = np.repeat(np.arange(len(num_atoms)), num_atoms)
    atom_start = np.concatenate(([0], np.cumsum(num_atoms)[:-1])).astype(np.int64)
    found: list[tuple[int, str]] = []  # (record, what is wrong)
    # In numpy: torch's threaded reductions are slow on a busy CPU.
    z = fields["atomic_numbers"]
    if z.dtype.is_floating_point or z.dtype.is_complex or z.dtype == torch.bool or z.dim() != 1:
        found.append((0, f"atomic_numbers are stored as {z.dtype} rows of shape {list(z.shape[1:])}, not integers"))
    elif z.numel() and int(_numpy(z).min()) < 0:
        row = int(np.flatnonzero(_numpy(z) < 0)[0])
        found.append(_at(row, atom_owner, atom_start, f"atomic number {int(z[row])}", "(atomic numbers are 0 or more)"))
    # A quarantined record (negative status) keeps the values that failed, as evidence.
    failed = _quarantined(fields, len(num_atoms))
    for name in sorted(FINITE_FIELDS & fields.keys()):
        t = fields[name]
        if t.dtype.is_floating_point and t.numel() and not _all_finite(_numpy(t)):
            rows_ok = np.isfinite(_numpy(t)).reshape(t.shape[0], -1).all(axis=1)
            if failed is not None:
                rows_ok |= failed[atom_owner] if t.shape[0] == len(atom_owner) else failed
            if bool(rows_ok.all()):
                continue
            row = int(np.flatnonzero(~rows_ok)[0])
            if name == "cell":
                found.append((row, "cell holds NaN or infinite values"))
            else:
                found.append(_at(row, atom_owner, atom_start, f"{name} hold NaN or infinite values", ""))
    masses = fields.get("atomic_masses")
    if masses is not None and masses.numel():
        m = _numpy(masses).reshape(masses.shape[0], -1)
        if not (_all_finite(m) and float(m.min()) > 0):
            row = int(np.flatnonzero(~(np.isfinite(m) & (m > 0)).all(axis=1))[0])
            found.append(_at(row, atom_owner, atom_start, f"atomic mass {m[row, 0]:g}", "(masses are finite and positive)"))
    pairs = fields.get("neighbor_list")
    if pairs is not None and pairs.numel() and pairs.dim() == 2 and not pairs.dtype.is_floating_point:
        local = _numpy(pairs)
        bound = np.repeat(np.asarray(num_atoms, dtype=np.int64), num_edges)[:, None]
        bad = ((local < 0) | (local >= bound)).any(axis=1)
        if bool(bad.any()):
            row = int(np.flatnonzero(bad)[0])
            record = int(np.repeat(np.arange(len(num_edges)), num_edges)[row])
            found.append((record, f"neighbor_list holds atom indices {local[row].tolist()} outside the record's "
                                  f"{int(num_atoms[record])} atoms"))
    if found:
        record, what = min(found, key=lambda f: f[0])
        raise InvalidDataError(
            f"record {first + record} of {where}{_identity(fields, record)} is not a valid structure: {what}; "
            "the store holds it as written. Read the records around it by index, or its raw columns with "
            "store.read_rows(name, start, stop)"
        )


def _quarantined(fields: Mapping[str, torch.Tensor], records: int) -> np.ndarray | None:
    """``[records]`` bool: records stored with a negative status (quarantined), or None."""
    status = fields.get("status")
    if status is None or status.shape[0] != records:
        return None
    return np.asarray(_numpy(status)).reshape(records, -1)[:, 0] < 0


#: Fields that tell a structure's records apart: a trajectory stores one structure (one
#: ``system_id``) many times, at other statuses or stage steps.
IDENTITY = ("system_id", "status", "stage_steps")


def repeated_records(columns: Mapping[str, np.ndarray]) -> list[list[int]]:
    """Groups of record indices where a structure's last record (its result, or its latest frame)
    is stored twice or more: the same ``system_id``, ``status`` and ``stage_steps`` (where the
    store has them). Earlier frames that repeat (a rerun trajectory) are not counted.

    Example:
        >>> ids, status = np.array([0, 1, 0, 0, 1, 1]), np.array([0, 0, 0, 2, 2, 2])
        >>> repeated_records({"system_id": ids, "status": status})   # 0's frame twice, 1's result twice
        [[4, 5]]
    """
    present = [np.asarray(columns[k]).reshape(len(columns[k]), -1)[:, 0] for k in IDENTITY if k in columns]
    if "system_id" not in columns or not len(present[0]):
        return []
    keys = np.stack(present, axis=1).astype(np.int64)
    _, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    if (counts < 2).all():
        return []
    ids = present[0]
    _, from_end = np.unique(ids[::-1], return_index=True)
    last = len(ids) - 1 - from_end  # each structure's last record
    groups = np.unique(inverse[last][counts[inverse[last]] > 1])
    return [np.nonzero(inverse == g)[0].tolist() for g in groups]


def check_unique(columns: Mapping[str, Any], first: int, where: str) -> None:
    """Raise when records hold one record twice (see :func:`repeated_records`).

    Args:
        columns: ``system_id`` (and ``status``, ``stage_steps`` where present) of the records
            (other fields are ignored).
        first: The store index of the first of them (for the message).
        where: The store (for the message).

    Raises:
        InvalidDataError: Naming the repeated ``system_id`` values and their records.
    """
    groups = repeated_records({k: np.asarray(columns[k]) for k in IDENTITY if k in columns})
    if not groups:
        return
    ids = np.asarray(columns["system_id"]).reshape(-1)
    kept = ", ".join(k for k in IDENTITY if k in columns)
    shown = "; ".join(f"system_id {int(ids[g[0]])} at records {[first + i for i in g]}" for g in groups[:5])
    more = f" and {len(groups) - 5} more" if len(groups) > 5 else ""
    raise InvalidDataError(
        f"{where} holds {len(groups)} structure(s) stored twice or more (the same {kept}): {shown}{more}. "
        "Each structure of a results store is stored once; this one was written twice over (a rerun into "
        "the same store) or crafted. Copy one record of each to a new store (by index) to use it"
    )


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A host tensor's values as numpy (half and bfloat16 widened to float32)."""
    return (t.float() if t.dtype in (torch.float16, torch.bfloat16) else t).numpy()


def _all_finite(a: np.ndarray) -> bool:
    """Every value finite: one sum on valid data (an overflow falls back to the exact test)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return math.isfinite(float(a.sum())) or bool(np.isfinite(a).all())


def _at(row: int, owner: np.ndarray, start: np.ndarray, what: str, why: str) -> tuple[int, str]:
    record = int(owner[row])
    return record, f"{what} at atom {row - int(start[record])}" + (f" {why}" if why else "")


def _identity(fields: Mapping[str, torch.Tensor], record: int) -> str:
    """`` (system_id 7, status -1)``: what the message can say of the record."""
    parts = []
    for name in ("system_id", "status"):
        t = fields.get(name)
        if t is not None and t.shape[0] > record and not t.dtype.is_floating_point:
            parts.append(f"{name} {int(t[record].reshape(-1)[0])}")
    return f" ({', '.join(parts)})" if parts else ""
