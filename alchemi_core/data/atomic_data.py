"""``AtomicData``: one structure (a molecule or a periodic cell), validated when it is made.

Example:
    >>> import torch
    >>> from alchemi_core.data import AtomicData
    >>> data = AtomicData(
    ...     atomic_numbers=torch.tensor([8, 1, 1]),
    ...     positions=torch.tensor([[0.0, 0.0, 0.0], [0.96, 0.0, 0.0], [-0.24, 0.93, 0.0]]),
    ... )
    >>> data.num_nodes, data.positions.dtype
    (3, torch.float32)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from alchemi_core.data.fields import Level, infer_level, level_of
from alchemi_core.data.values import check_values
from alchemi_core.errors import InvalidDataError

if TYPE_CHECKING:
    import ase

# Shapes the known system-level fields take per structure (after the leading system dim of 1).
_SYSTEM_SHAPES: dict[str, tuple[int, ...]] = {
    "cell": (3, 3),
    "pbc": (3,),
    "energy": (1,),
    "stress": (3, 3),
    "virial": (3, 3),
    "status": (),
    "system_id": (),
    "fmax": (),
    "energy_change": (),
    "charge": (),
    "spin": (),
}
_INTEGER_SYSTEM_FIELDS = frozenset({"status", "system_id", "charge", "spin"})
_NODE_VECTOR_FIELDS = frozenset({"positions", "velocities", "forces"})


def _as_tensor(name: str, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(value)
    except Exception as exc:  # noqa: BLE001 - any conversion failure is the user's input
        raise InvalidDataError(f"field {name!r} cannot be turned into a tensor: {exc}") from exc


class AtomicData:
    """One atomic structure: required ``atomic_numbers`` and ``positions``, plus any other fields.

    Known fields are checked and normalised (``cell`` becomes ``[1, 3, 3]``, ``energy``
    ``[1, 1]``, ``pbc`` a ``[1, 3]`` bool tensor); custom fields are stored at the level their
    leading dimension shows, or at the level given in ``levels``.

    Args:
        atomic_numbers: ``[N]`` integer tensor.
        positions: ``[N, 3]`` floating tensor in Å, all finite.
        levels: Optional ``{field: "node" | "edge" | "system"}`` for custom fields.
        **fields: Any other field, e.g. ``cell``, ``pbc``, ``velocities`` (Å/fs),
            ``atomic_masses`` (amu), ``energy`` (eV), ``neighbor_list`` (``[E, 2]``), ``charge``
            (the total charge in e, an integer) and ``spin`` (the spin multiplicity 2S + 1; 0: not
            given), ``charges`` (``[N]`` partial charges in e).

    Raises:
        InvalidDataError: A field has a wrong shape, dtype or value; the message says which.
    """

    __slots__ = ("_fields", "_levels")

    def __init__(
        self,
        *,
        atomic_numbers: Any,
        positions: Any,
        levels: Mapping[str, str | Level] | None = None,
        **fields: Any,
    ) -> None:
        z = _as_tensor("atomic_numbers", atomic_numbers)
        if z.dtype.is_floating_point or z.dtype.is_complex or z.dtype == torch.bool:
            raise InvalidDataError(
                f"atomic_numbers must be an integer tensor, got dtype {z.dtype}; "
                "pass torch.tensor([...], dtype=torch.long)"
            )
        if z.dim() != 1:
            raise InvalidDataError(f"atomic_numbers must have shape [N], got {list(z.shape)}")
        pos = _as_tensor("positions", positions)
        if not pos.dtype.is_floating_point:
            pos = pos.to(torch.get_default_dtype())
        if pos.dim() != 2 or pos.shape[1] != 3 or pos.shape[0] != z.shape[0]:
            raise InvalidDataError(
                f"positions must have shape [N, 3] with N = len(atomic_numbers) = {z.shape[0]}, "
                f"got {list(pos.shape)}"
            )
        if z.numel() and int(z.min()) < 0:
            raise InvalidDataError("atomic_numbers must be non-negative")
        check_values("positions", pos)
        self._fields: dict[str, torch.Tensor] = {"atomic_numbers": z, "positions": pos}
        self._levels: dict[str, Level] = {"atomic_numbers": Level.NODE, "positions": Level.NODE}
        given = {k: Level(v) for k, v in (levels or {}).items()}
        # Edges first, so custom edge fields can be recognised by their length.
        if "neighbor_list" in fields:
            self._set("neighbor_list", fields.pop("neighbor_list"), Level.EDGE)
        for name, value in fields.items():
            if value is None:
                continue
            self._set(name, value, given.get(name))

    # ------------------------------------------------------------------ construction helpers
    def _set(self, name: str, value: Any, level: Level | None) -> None:
        t = _as_tensor(name, value)
        n, e = self.num_nodes, self.num_edges
        if level is None:
            level = level_of(name)
        if level is None:
            if t.dim() == 0:
                level = Level.SYSTEM
            else:
                level = infer_level(name, t.shape[0], n, e, 1)
        if level is Level.SYSTEM:
            t = self._normalise_system(name, t)
        elif level is Level.NODE:
            t = self._normalise_node(name, t, n)
        else:
            t = self._normalise_edge(name, t, n, e)
        self._fields[name] = t
        self._levels[name] = level

    @staticmethod
    def _normalise_system(name: str, t: torch.Tensor) -> torch.Tensor:
        shape = _SYSTEM_SHAPES.get(name)
        if name == "pbc":
            t = t.to(torch.bool)
        if name in _INTEGER_SYSTEM_FIELDS:
            if t.dtype.is_floating_point:
                raise InvalidDataError(f"{name} must be an integer, got dtype {t.dtype}")
            t = t.to(torch.long)
        if shape is None:
            # Custom system field: one row, whatever its trailing shape.
            return t.reshape(1) if t.dim() == 0 else (t if t.shape[0] == 1 else t.unsqueeze(0))
        if t.numel() != math.prod(shape):
            raise InvalidDataError(
                f"{name} must hold {math.prod(shape)} values per structure (shape {list(shape)}), "
                f"got shape {list(t.shape)}"
            )
        t = t.reshape((1, *shape))
        if name == "cell":
            if not t.dtype.is_floating_point:
                t = t.to(torch.get_default_dtype())
            check_values("cell", t)
        return t

    @staticmethod
    def _normalise_node(name: str, t: torch.Tensor, n: int) -> torch.Tensor:
        if t.dim() == 0 or t.shape[0] != n:
            raise InvalidDataError(
                f"atom field {name!r} must have one row per atom ({n}), got shape {list(t.shape)}"
            )
        if name in _NODE_VECTOR_FIELDS and tuple(t.shape[1:]) != (3,):
            raise InvalidDataError(f"{name} must have shape [N, 3], got {list(t.shape)}")
        if name == "atomic_masses":
            t = t.reshape(n)
        check_values(name, t)
        return t

    @staticmethod
    def _normalise_edge(name: str, t: torch.Tensor, n: int, e: int) -> torch.Tensor:
        if name == "neighbor_list":
            if t.dtype.is_floating_point or t.dtype == torch.bool:
                raise InvalidDataError(f"neighbor_list must be integer, got dtype {t.dtype}")
            if t.dim() != 2 or t.shape[1] != 2:
                hint = " (it looks like [2, E]: pass edge_index.T)" if t.dim() == 2 and t.shape[0] == 2 else ""
                raise InvalidDataError(f"neighbor_list must have shape [E, 2], got {list(t.shape)}{hint}")
            t = t.to(torch.long)
            if t.numel() and (int(t.min()) < 0 or int(t.max()) >= n):
                raise InvalidDataError(
                    f"neighbor_list holds atom indices outside [0, {n}): min {int(t.min())}, "
                    f"max {int(t.max())}"
                )
            return t
        if t.dim() == 0 or t.shape[0] != e:
            raise InvalidDataError(
                f"edge field {name!r} must have one row per edge ({e}), got shape {list(t.shape)}"
            )
        return t

    # ------------------------------------------------------------------ access
    def __getattr__(self, name: str) -> torch.Tensor:
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(
                f"AtomicData has no field {name!r}; it has {sorted(self._fields)}"
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name in AtomicData.__slots__:
            object.__setattr__(self, name, value)
        else:
            self._set(name, value, None)

    def __contains__(self, name: object) -> bool:
        return name in self._fields

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self._fields.items())

    def get(self, name: str, default: Any = None) -> Any:
        return self._fields.get(name, default)

    def keys(self) -> list[str]:
        return list(self._fields)

    @property
    def levels(self) -> dict[str, Level]:
        """The level of every field."""
        return dict(self._levels)

    @property
    def num_nodes(self) -> int:
        return int(self._fields["atomic_numbers"].shape[0])

    @property
    def num_edges(self) -> int:
        nl = self._fields.get("neighbor_list")
        return 0 if nl is None else int(nl.shape[0])

    @property
    def device(self) -> torch.device:
        return self._fields["positions"].device

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> AtomicData:
        """A copy on ``device``; ``dtype`` converts floating fields only."""
        out = object.__new__(AtomicData)
        fields = {}
        for k, v in self._fields.items():
            if dtype is not None and v.dtype.is_floating_point:
                v = v.to(dtype)
            fields[k] = v.to(device) if device is not None else v
        object.__setattr__(out, "_fields", fields)
        object.__setattr__(out, "_levels", dict(self._levels))
        return out

    def with_system_id(self, system_id: int) -> AtomicData:
        """A shallow copy (the same tensors) whose ``system_id`` is ``system_id``.

        Example:
            >>> import torch
            >>> d = AtomicData(atomic_numbers=[1, 1], positions=torch.zeros(2, 3))
            >>> d.with_system_id(7).system_id.tolist(), "system_id" in d
            ([7], False)
        """
        out = self.to()
        out._fields["system_id"] = torch.tensor([int(system_id)], dtype=torch.long)
        out._levels["system_id"] = Level.SYSTEM
        return out

    def clone(self) -> AtomicData:
        out = self.to()
        out._fields.update({k: v.clone() for k, v in out._fields.items()})
        return out

    @classmethod
    def _from_fields(cls, fields: dict[str, torch.Tensor], levels: dict[str, Level]) -> AtomicData:
        """Internal: wrap already-validated tensors (used by ``Batch.to_data_list``)."""
        out = object.__new__(cls)
        object.__setattr__(out, "_fields", fields)
        object.__setattr__(out, "_levels", levels)
        return out

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={list(v.shape)}" for k, v in self._fields.items())
        return f"AtomicData({parts})"

    # ------------------------------------------------------------------ ASE
    @classmethod
    def from_atoms(cls, atoms: ase.Atoms, dtype: torch.dtype | None = None, device: Any = None) -> AtomicData:
        """Build from an ASE ``Atoms``, losing nothing (see :mod:`alchemi_core.data.ase_io`):
        numbers, positions, cell, pbc, masses, velocities (converted to Å/fs), tags, initial
        charges and magnetic moments, ``info``, constraints (``FixAtoms`` becomes the atom field
        ``frozen``, ``FixCartesian`` of some components ``frozen_axes``) and any energy, forces
        and stress its calculator holds.

        Raises:
            InvalidDataError: A constraint alchemi cannot honour, or an ``info`` value it cannot hold.

        Example:
            >>> from ase.build import bulk
            >>> data = AtomicData.from_atoms(bulk("Ar", "fcc", a=5.26, cubic=True))
            >>> data.cell.shape, data.pbc.tolist()
            (torch.Size([1, 3, 3]), [[True, True, True]])
        """
        from alchemi_core.data.ase_io import fields_from_atoms

        fields, levels = fields_from_atoms(atoms, dtype or torch.get_default_dtype())
        data = cls(levels=levels, **fields)
        return data.to(device) if device is not None else data

    def to_atoms(self, exclude: Iterable[str] = ()) -> ase.Atoms:
        """An ASE ``Atoms`` with everything :meth:`from_atoms` takes in: numbers, positions, cell,
        pbc, masses, velocities (unless all zero), tags, charges, magnetic moments, ``info``, a
        ``FixAtoms`` for ``frozen`` atoms and a ``FixCartesian`` per pattern of ``frozen_axes``;
        energy, forces and stress in a ``SinglePointCalculator``.
        Other atom fields go to ``atoms.arrays``, other system fields (``system_id``, ``status``,
        ``fmax``, ...) to ``atoms.info``; ``exclude`` names fields to leave out."""
        from alchemi_core.data.ase_io import atoms_from_fields

        return atoms_from_fields({k: v.detach().cpu() for k, v in self._fields.items()}, self._levels, exclude)
