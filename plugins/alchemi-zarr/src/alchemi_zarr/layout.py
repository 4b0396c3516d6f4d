"""The on-disk layout of an alchemi Zarr store (format version 1), as plain data.

A store is one Zarr v3 group::

    <root>/                 group; attributes["alchemi"] = the header (format, version, fields)
    <root>/commit           int64 [3]: committed systems, atoms, edges (written last)
    <root>/atom_ptr         int64 [S + 1 ...]: system i owns atom rows atom_ptr[i]:atom_ptr[i+1]
    <root>/edge_ptr         int64 [S + 1 ...]: system i owns edge rows edge_ptr[i]:edge_ptr[i+1]
    <root>/atoms/<field>    one row per atom, all systems concatenated
    <root>/edges/<field>    one row per edge, all systems concatenated
    <root>/systems/<field>  one row per system

Arrays may be longer than the committed count; only rows below the committed pointers are
records. Index fields (``neighbor_list``) hold atom indices local to their system.
``docs/storage.md`` describes the format for people; this module is its single definition.

Example:
    >>> import torch
    >>> spec = FieldSpec.of("positions", "node", torch.zeros(5, 3))
    >>> spec.to_json()
    {'level': 'node', 'dtype': 'float32', 'shape': [3], 'units': 'Å'}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
import torch

from alchemi_core.data.fields import INDEX_FIELDS, Level
from alchemi_core.errors import InvalidDataError

FORMAT_NAME = "alchemi.atomic-data"
FORMAT_VERSION = 1
HEADER_KEY = "alchemi"
COMMIT = "commit"
ATOM_PTR = "atom_ptr"
EDGE_PTR = "edge_ptr"
#: Sub-group holding the fields of each level.
LEVEL_GROUP: dict[Level, str] = {Level.NODE: "atoms", Level.EDGE: "edges", Level.SYSTEM: "systems"}

#: Units of the fields alchemi knows; other fields record ``None`` unless the writer is told.
KNOWN_UNITS: dict[str, str] = {
    "positions": "Å",
    "cell": "Å",
    "velocities": "Å/fs",
    "forces": "eV/Å",
    "fmax": "eV/Å",
    "energy": "eV",
    "energy_prev": "eV",
    "energy_change": "eV",
    "stress": "eV/Å³",
    "virial": "eV",
    "atomic_masses": "amu",
    "charges": "e",
    "charge": "e",
}

# torch dtype -> (header name, numpy dtype stored); bfloat16's bits are stored as uint16.
_DTYPES: dict[torch.dtype, tuple[str, np.dtype]] = {
    torch.bool: ("bool", np.dtype(np.bool_)),
    torch.uint8: ("uint8", np.dtype(np.uint8)),
    torch.int8: ("int8", np.dtype(np.int8)),
    torch.int16: ("int16", np.dtype(np.int16)),
    torch.int32: ("int32", np.dtype(np.int32)),
    torch.int64: ("int64", np.dtype(np.int64)),
    torch.float16: ("float16", np.dtype(np.float16)),
    torch.bfloat16: ("bfloat16", np.dtype(np.uint16)),
    torch.float32: ("float32", np.dtype(np.float32)),
    torch.float64: ("float64", np.dtype(np.float64)),
    torch.complex64: ("complex64", np.dtype(np.complex64)),
    torch.complex128: ("complex128", np.dtype(np.complex128)),
}
_BY_NAME: dict[str, torch.dtype] = {name: dt for dt, (name, _) in _DTYPES.items()}

#: Uncompressed bytes aimed at per chunk: small for cheap random access (reading one system
#: decodes about one chunk per field), large for few chunks per snapshot (zarr's cost is per chunk).
CHUNK_BYTES = 512 * 1024
MIN_CHUNK_ROWS = 256
MAX_CHUNK_ROWS = 1 << 18
POINTER_CHUNK_ROWS = 16384


def dtype_name(dtype: torch.dtype, field: str) -> str:
    """The header name of a torch dtype.

    Raises:
        InvalidDataError: The dtype cannot be stored.
    """
    try:
        return _DTYPES[dtype][0]
    except KeyError:
        raise InvalidDataError(
            f"field {field!r} has dtype {dtype}, which an alchemi Zarr store cannot hold; "
            f"convert it to one of {sorted(_BY_NAME)}"
        ) from None


def torch_dtype(name: str, field: str) -> torch.dtype:
    """The torch dtype a header name stands for.

    Raises:
        InvalidDataError: The header names an unknown dtype (a damaged or foreign store).
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise InvalidDataError(
            f"the store records dtype {name!r} for field {field!r}, which this version of "
            "alchemi-zarr does not know; upgrade alchemi-zarr or check the store"
        ) from None


def storage_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype zarr stores for a torch dtype."""
    return _DTYPES[dtype][1]


def chunk_rows(row_bytes: int) -> int:
    """Rows per chunk for rows of ``row_bytes`` bytes: a power of two near ``CHUNK_BYTES``."""
    target = max(1, CHUNK_BYTES // max(1, row_bytes))
    rows = 1 << (target.bit_length() - 1)
    return int(min(MAX_CHUNK_ROWS, max(MIN_CHUNK_ROWS, rows)))


@attrs.frozen
class FieldSpec:
    """What the header records of one field."""

    level: Level
    dtype: torch.dtype
    shape: tuple[int, ...]  # trailing shape of one row
    units: str | None = None

    @classmethod
    def of(cls, name: str, level: Level | str, tensor: torch.Tensor, units: str | None = None) -> FieldSpec:
        """The spec of a batch field; ``units`` default to :data:`KNOWN_UNITS`."""
        dtype_name(tensor.dtype, name)
        return cls(Level(level), tensor.dtype, tuple(int(s) for s in tensor.shape[1:]), units or KNOWN_UNITS.get(name))

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * storage_dtype(self.dtype).itemsize

    def to_json(self) -> dict[str, Any]:
        return {
            "level": self.level.value,
            "dtype": dtype_name(self.dtype, "?"),
            "shape": list(self.shape),
            "units": self.units,
        }

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> FieldSpec:
        """Parse one header entry, rejecting anything malformed.

        Raises:
            InvalidDataError: A missing key or a value of the wrong kind.
        """
        try:
            level = Level(data["level"])
            shape = tuple(int(s) for s in data["shape"])
            units = data.get("units")
            dtype = torch_dtype(str(data["dtype"]), name)
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidDataError(f"the store's header entry for field {name!r} is malformed: {exc!r}") from None
        if units is not None and not isinstance(units, str):
            raise InvalidDataError(f"the store's header gives field {name!r} non-text units {units!r}")
        return cls(level, dtype, shape, units)

    def describe(self) -> str:
        return f"{self.level.value} {dtype_name(self.dtype, '?')} {list(self.shape)}"


@attrs.frozen
class Header:
    """The store's header: format, version and the fields every record has."""

    fields: dict[str, FieldSpec]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "fields": {k: v.to_json() for k, v in self.fields.items()},
            "local_index_fields": sorted(INDEX_FIELDS & self.fields.keys()),
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> Header:
        """Parse the header of the store at ``where``.

        Raises:
            InvalidDataError: Not an alchemi store, a newer format, or a malformed header.
        """
        if not isinstance(data, Mapping) or data.get("format") != FORMAT_NAME:
            raise InvalidDataError(
                f"{where} is a Zarr group but not an alchemi store (its attribute "
                f"{HEADER_KEY!r} lacks format {FORMAT_NAME!r}); open another path"
            )
        version = data.get("version")
        if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
            raise InvalidDataError(
                f"{where} has alchemi store format version {version!r}; this alchemi-zarr reads "
                f"versions 1 to {FORMAT_VERSION}. Upgrade alchemi-zarr"
            )
        fields = data.get("fields")
        if not isinstance(fields, Mapping):
            raise InvalidDataError(f"{where}: the header's 'fields' is not a mapping")
        return cls({str(k): FieldSpec.from_json(str(k), v) for k, v in fields.items()})

    def mismatch(self, other: Mapping[str, FieldSpec]) -> str | None:
        """Why records with fields ``other`` do not fit this store (None when they do)."""
        problems = []
        missing = sorted(self.fields.keys() - other.keys())
        extra = sorted(other.keys() - self.fields.keys())
        if missing:
            problems.append(f"missing fields {missing}")
        if extra:
            problems.append(f"fields the store lacks {extra}")
        for name in sorted(self.fields.keys() & other.keys()):
            a, b = self.fields[name], other[name]
            if (a.level, a.dtype, a.shape) != (b.level, b.dtype, b.shape):
                problems.append(f"{name!r} is {b.describe()} but the store holds {a.describe()}")
        return "; ".join(problems) or None
