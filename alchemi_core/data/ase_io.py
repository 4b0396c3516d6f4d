"""ASE ``Atoms`` to alchemi fields and back, with nothing lost.

What travels, in both directions:

* numbers, positions, cell, pbc, masses, velocities (Å/fs) and the calculator's energy, forces,
  stress and partial charges (atom field ``charges``; into a ``SinglePointCalculator`` on the way
  back);
* ``tags`` (atom field ``tags``), initial charges (``initial_charges``) and initial magnetic
  moments (``initial_magmoms``, ``[N]`` or ``[N, 3]``), when the ``Atoms`` has them;
* ``info``: numbers, bools and numeric arrays become system fields ``info_<key>``; strings become
  fixed-width UTF-8 system fields ``infotext_<key>`` (at most :data:`TEXT_WIDTH` bytes); anything
  else ASE's JSON encoder takes (dicts such as ``adsorbate_info``, lists, None) becomes
  ``infojson_<key>`` (at most :data:`JSON_WIDTH` bytes of JSON);
* the total charge and spin multiplicity, ``atoms.info["charge"]`` and ``atoms.info["spin"]``
  (the convention of fairchem and ASE's calculators), become the integer system fields
  ``charge`` (e) and ``spin`` (2S + 1), present only when given; back in ``atoms.info``. In a
  batch of structures some of which give them, the others take charge 0 (neutral) and spin 0
  (not given, never written back);
* constraints: atoms ``FixAtoms`` holds (or ``FixCartesian`` in all three components) become the
  bool atom field ``frozen``; atoms ``FixCartesian`` holds in some components only become rows of
  the ``[N, 3]`` bool atom field ``frozen_axes`` (True: that component held), present only where
  some atom is held so. Every alchemi stage keeps them in place
  (:mod:`alchemi_core.dynamics.constraints`). On the way back ``frozen`` becomes a ``FixAtoms``
  and each pattern of ``frozen_axes`` a ``FixCartesian``. ``FixSymmetry(atoms, symprec)`` becomes
  the system field ``symprec`` (the space group is kept through relaxations:
  :mod:`alchemi_core.dynamics.symmetry`) and ``FixCom`` the bool system field ``fix_com``; both come
  back as those constraints. Any other constraint (bond lengths, ``FixSymmetry`` without
  ``adjust_positions`` or ``adjust_cell``, ``FixSubsetCom``) is an error: alchemi cannot honour it
  and never drops one silently.

A structure that left an optimiser (FIRE) has zero velocities (the optimiser's are not physical),
so ``to_atoms`` of a relaxed structure carries no momenta. Zero velocities are not written back.

Example:
    >>> from ase.build import bulk
    >>> from ase.constraints import FixAtoms
    >>> from alchemi_core.data import AtomicData
    >>> atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    >>> atoms.set_tags([0, 1, 1, 1])
    >>> atoms.set_constraint(FixAtoms(indices=[0]))
    >>> atoms.info["config_type"] = "bulk"
    >>> data = AtomicData.from_atoms(atoms)
    >>> data.frozen.tolist(), data.tags.tolist()
    ([True, False, False, False], [0, 1, 1, 1])
    >>> back = data.to_atoms()
    >>> back.info["config_type"], back.constraints[0].get_indices().tolist()
    ('bulk', [0])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from alchemi_core.data.fields import FIX_COM, FROZEN_AXES, SYMPREC
from alchemi_core.errors import InvalidDataError

if TYPE_CHECKING:
    import ase

#: Bytes a text field (an ``info`` string, a source file name) holds per structure.
TEXT_WIDTH = 256
#: Bytes of JSON an ``info`` value of another kind (a dict, a list) may take per structure.
JSON_WIDTH = 1024
INFO_PREFIX = "info_"
TEXT_PREFIX = "infotext_"
JSON_PREFIX = "infojson_"
_INFO_PREFIXES = (INFO_PREFIX, TEXT_PREFIX, JSON_PREFIX)
#: Atom arrays of ``Atoms`` that travel as atom fields, and the defaults of absent ones.
ATOM_ARRAYS = ("tags", "initial_charges", "initial_magmoms")
#: ``atoms.info`` keys that travel as integer system fields of the same name: the total charge
#: (e) and the spin multiplicity (2S + 1; 0 stands for "not given").
SYSTEM_INFO = ("charge", "spin")
#: Fields ``atoms_from_fields`` places itself (everything else goes to ``arrays``/``info``).
PLACED = frozenset(
    {"atomic_numbers", "positions", "velocities", "atomic_masses", "forces", "cell", "pbc", "energy", "stress",
     "charges", "frozen", FROZEN_AXES, SYMPREC, FIX_COM, *ATOM_ARRAYS, *SYSTEM_INFO}
)

#: Edge fields: a frame of an ASE file has no place for them, so file exports leave them out.
EDGE_FIELDS = ("neighbor_list", "shifts", "neighbor_list_shifts")


def encode_text(text: str, name: str, width: int = TEXT_WIDTH) -> torch.Tensor:
    """``text`` as a ``[width]`` uint8 tensor (UTF-8, zero-padded).

    Raises:
        InvalidDataError: Longer than ``width`` bytes.
    """
    raw = text.encode("utf-8")
    if len(raw) > width or b"\x00" in raw:
        raise InvalidDataError(
            f"{name!r} is {len(raw)} bytes of text; alchemi keeps at most {width} bytes (no NUL) per "
            f"structure: shorten it or delete atoms.info[{name!r}] before converting"
        )
    out = torch.zeros(width, dtype=torch.uint8)
    out[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else out[:0]
    return out


def decode_text(value: Any) -> str:
    """The string a text field row holds."""
    raw = bytes(np.asarray(value, dtype=np.uint8).reshape(-1).tolist())
    return raw.split(b"\x00", 1)[0].decode("utf-8")


def _to_json(name: str, value: Any) -> str:
    from ase.io.jsonio import encode

    try:
        return str(encode(value))
    except (TypeError, ValueError) as exc:
        raise InvalidDataError(
            f"atoms.info[{name!r}] is a {type(value).__name__} that alchemi cannot store ({exc}); keep numbers, "
            f"strings, arrays, lists and dicts in info, or delete atoms.info[{name!r}] before converting"
        ) from None


def held_components(atoms: ase.Atoms) -> np.ndarray | None:
    """``[N, 3]`` bool of the Cartesian components ``FixAtoms`` and ``FixCartesian`` hold, or None
    without constraints.

    Raises:
        InvalidDataError: A constraint alchemi cannot honour.
    """
    from ase.constraints import FixAtoms, FixCartesian

    if not atoms.constraints:
        return None
    held = np.zeros((len(atoms), 3), dtype=bool)
    for c in atoms.constraints:
        if _system_constraint(c) is not None:
            continue
        if isinstance(c, FixAtoms):
            held[c.get_indices()] = True
        elif isinstance(c, FixCartesian):
            held[c.get_indices()] |= np.asarray(c.mask, dtype=bool).reshape(1, 3)
        else:
            raise InvalidDataError(
                f"the structure has a {type(c).__name__} constraint, which alchemi cannot honour (it holds "
                "atoms or Cartesian components fixed: FixAtoms, FixCartesian; and keeps FixSymmetry, FixCom); "
                "remove it "
                "(atoms.set_constraint()) or replace it with one of those"
            )
    return held


def _system_constraint(c: Any) -> tuple[str, torch.Tensor] | None:
    """The system field of a ``FixSymmetry`` or ``FixCom`` (None for other constraints).

    Raises:
        InvalidDataError: A ``FixSymmetry`` that leaves positions or the cell free.
    """
    from ase.constraints import FixCom, FixSymmetry

    if type(c) is FixCom:
        return FIX_COM, torch.tensor([True])
    if not isinstance(c, FixSymmetry):
        return None
    if not (c.do_adjust_positions and c.do_adjust_cell):
        raise InvalidDataError(
            "the structure has a FixSymmetry with adjust_positions or adjust_cell off, which alchemi cannot "
            "honour (it symmetrises forces, stress, positions and cell steps together); make it with the "
            "defaults, FixSymmetry(atoms, symprec=...)"
        )
    return SYMPREC, torch.tensor([float(c.symprec)], dtype=torch.float64)


def _constraint_fields(atoms: ase.Atoms) -> dict[str, torch.Tensor]:
    """``frozen`` for every structure with constraints, ``frozen_axes`` where some atom is
    held in only some components, ``symprec`` and ``fix_com`` for ``FixSymmetry`` and ``FixCom``."""
    fields: dict[str, torch.Tensor] = {}
    for c in atoms.constraints:
        pair = _system_constraint(c)
        if pair is not None:
            fields[pair[0]] = pair[1]
    held = held_components(atoms)
    if held is None or len(fields) == len(atoms.constraints):
        return fields
    whole = np.asarray(held.all(axis=1), dtype=bool)
    fields["frozen"] = torch.from_numpy(whole)
    if bool((held.any(axis=1) & ~whole).any()):
        fields[FROZEN_AXES] = torch.from_numpy(held & ~whole[:, None])
    return fields


def _constraints(f: Mapping[str, torch.Tensor], atoms: ase.Atoms) -> list[Any]:
    """ASE constraints for one structure's ``frozen``/``frozen_axes``: a ``FixAtoms`` of the atoms
    held whole, one ``FixCartesian`` per pattern of the atoms held in some components only; a
    ``FixSymmetry`` for ``symprec`` above 0 (found on a copy of ``atoms``, which stays bit for bit
    as it is) and a ``FixCom`` for ``fix_com``."""
    from ase.constraints import FixAtoms, FixCartesian, FixCom, FixSymmetry

    n = int(f["atomic_numbers"].shape[0])
    held = np.zeros((n, 3), dtype=bool)
    if "frozen" in f:
        held |= f["frozen"].reshape(-1, 1).numpy().astype(bool)
    if FROZEN_AXES in f:
        held |= f[FROZEN_AXES].reshape(n, 3).numpy().astype(bool)
    whole = held.all(axis=1)
    out: list[Any] = [FixAtoms(mask=whole)] if whole.any() else []
    partial = held.any(axis=1) & ~whole
    for pattern in np.unique(held[partial], axis=0):
        atoms_held = np.flatnonzero(partial & (held == pattern).all(axis=1))
        out.append(FixCartesian(atoms_held.tolist(), mask=tuple(bool(v) for v in pattern)))
    if SYMPREC in f and float(f[SYMPREC].reshape(-1)[0]) > 0:
        from alchemi_core.dynamics.symmetry import require_symmetry

        require_symmetry()  # a clear error without spglib or ASE's helpers
        out.append(FixSymmetry(atoms.copy(), symprec=float(f[SYMPREC].reshape(-1)[0])))
    if FIX_COM in f and bool(f[FIX_COM].reshape(-1)[0]):
        out.append(FixCom())
    return out


def _integer_info(name: str, value: Any) -> torch.Tensor:
    """``atoms.info[name]`` (an integral number) as a ``[1]`` int64 tensor."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not number.is_integer() or (name == "spin" and number < 0):
        raise InvalidDataError(
            f"atoms.info[{name!r}] is {value!r}; alchemi takes the total charge (e) and the spin multiplicity "
            f"(2S + 1) as integers, e.g. atoms.info['charge'] = 0, atoms.info['spin'] = 1"
        )
    return torch.tensor([int(number)], dtype=torch.long)


def _info_fields(info: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key, value in info.items():
        name = str(key)
        if name in SYSTEM_INFO and value is not None:
            out[name] = _integer_info(name, value)
            continue
        if isinstance(value, str):
            out[TEXT_PREFIX + name] = encode_text(value, name).unsqueeze(0)
            continue
        try:
            arr = np.asarray(value)
        except ValueError:  # ragged sequences
            arr = np.asarray(None)
        if arr.dtype.kind not in "biuf" or arr.dtype == object:
            out[JSON_PREFIX + name] = encode_text(_to_json(name, value), name, JSON_WIDTH).unsqueeze(0)
            continue
        t = torch.as_tensor(arr.astype(np.float64) if arr.dtype.kind == "f" else arr)
        out[INFO_PREFIX + name] = t.reshape(1, *t.shape) if t.dim() else t.reshape(1)
    return out


def fields_from_atoms(atoms: ase.Atoms, dtype: torch.dtype) -> tuple[dict[str, Any], dict[str, str]]:
    """The fields of ``AtomicData`` for ``atoms`` and the levels of the custom ones."""
    from ase import units

    fields: dict[str, Any] = {
        "atomic_numbers": torch.tensor(atoms.numbers, dtype=torch.long),
        "positions": torch.tensor(atoms.positions, dtype=dtype),
        "cell": torch.tensor(atoms.cell.array, dtype=dtype),
        "pbc": torch.tensor(atoms.pbc, dtype=torch.bool),
        "atomic_masses": torch.tensor(atoms.get_masses(), dtype=dtype),
    }
    levels: dict[str, str] = {}
    if atoms.has("momenta"):
        fields["velocities"] = torch.tensor(atoms.get_velocities() * units.fs, dtype=dtype)
    fields.update(_constraint_fields(atoms))
    for name in ATOM_ARRAYS:
        if atoms.has(name):
            value = torch.from_numpy(np.array(atoms.arrays[name]))
            fields[name] = value.to(dtype) if value.dtype.is_floating_point else value.to(torch.long)
            levels[name] = "node"
    for name, value in _info_fields(atoms.info).items():
        fields[name] = value
        levels[name] = "system"
    calc = atoms.calc
    results = getattr(calc, "results", {}) if calc is not None else {}
    if "energy" in results:
        fields["energy"] = torch.tensor([[results["energy"]]], dtype=dtype)
    if "forces" in results:
        fields["forces"] = torch.tensor(results["forces"], dtype=dtype)
    if "charges" in results:
        fields["charges"] = torch.tensor(results["charges"], dtype=dtype)
    if "stress" in results:
        from ase.stress import voigt_6_to_full_3x3_stress

        s = results["stress"]
        full = voigt_6_to_full_3x3_stress(s) if len(s) == 6 else s
        fields["stress"] = torch.tensor(full, dtype=dtype)
    return fields, levels


def atoms_from_fields(
    f: Mapping[str, torch.Tensor], levels: Mapping[str, Any] | None = None, exclude: Iterable[str] = ()
) -> ase.Atoms:
    """An ``Atoms`` from one structure's fields (on the CPU), the inverse of :func:`fields_from_atoms`.

    Fields it has no ASE place for go to ``atoms.arrays`` (atom fields, renamed ``alchemi_<name>``
    where ASE uses the name) and ``atoms.info`` (system fields: ``system_id``, ``status``, ``fmax``,
    ...); edge fields, engine state (``stage_steps``, an integrator's ``fire_dt``: see
    ``alchemi_core.registry.engine_state_fields``) and ``exclude`` are left out.

    Raises:
        InvalidDataError: A field of a dtype ASE files cannot hold (complex).
    """
    import ase
    from ase import units
    from ase.calculators.singlepoint import SinglePointCalculator

    atoms = ase.Atoms(
        numbers=f["atomic_numbers"].numpy(),
        positions=f["positions"].double().numpy(),
        cell=f["cell"][0].double().numpy() if "cell" in f else None,
        pbc=f["pbc"][0].numpy() if "pbc" in f else False,
    )
    if "atomic_masses" in f:
        atoms.set_masses(f["atomic_masses"].double().numpy())
    if "velocities" in f and bool(f["velocities"].any()):
        atoms.set_velocities(f["velocities"].double().numpy() / units.fs)
    if "tags" in f:
        atoms.set_tags(f["tags"].numpy().astype(int))
    if "initial_charges" in f:
        atoms.set_initial_charges(f["initial_charges"].double().numpy())
    if "initial_magmoms" in f:
        atoms.set_initial_magnetic_moments(f["initial_magmoms"].double().numpy())
    if "charge" in f:
        atoms.info["charge"] = int(f["charge"].reshape(-1)[0])
    if "spin" in f and int(f["spin"].reshape(-1)[0]):
        atoms.info["spin"] = int(f["spin"].reshape(-1)[0])
    for name, value in f.items():
        if name.startswith(_INFO_PREFIXES):
            info = _info_value(name, value)
            if info is not _ABSENT:
                atoms.info[_split_info(name)[1]] = info
    constraints = _constraints(f, atoms)
    if constraints:
        atoms.set_constraint(constraints)
    from alchemi_core.registry import engine_state_fields

    skip = set(exclude) | engine_state_fields()
    for name, value in f.items():
        level = str(getattr((levels or {}).get(name), "value", (levels or {}).get(name)))
        if name in PLACED or name in skip or name.startswith(_INFO_PREFIXES) or level not in _EXTRA_LEVELS:
            continue
        arr = _as_numpy(name, value)
        if level == "node":
            atoms.arrays[name if name not in atoms.arrays else f"alchemi_{name}"] = arr
        else:
            row = arr[0]
            atoms.info[name] = row.item() if row.ndim == 0 or row.size == 1 else row.reshape(-1)
    results: dict[str, Any] = {}
    if "energy" in f:
        results["energy"] = float(f["energy"].reshape(-1)[0])
    if "forces" in f:
        results["forces"] = f["forces"].double().numpy()
    if "charges" in f and "charges" not in skip:
        results["charges"] = f["charges"].double().numpy()
    if "stress" in f:
        results["stress"] = f["stress"][0].double().numpy()
    if results:
        atoms.calc = SinglePointCalculator(atoms, **results)
    return atoms


_EXTRA_LEVELS = ("node", "system")


def _as_numpy(name: str, t: torch.Tensor) -> np.ndarray:
    if t.dtype.is_complex:
        raise InvalidDataError(f"field {name!r} is complex, which ASE files cannot hold; exclude it")
    if t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()
    return t.numpy()


def harmonise(fields_list: list[dict[str, Any]]) -> None:
    """Make structures from different files batch together: every structure gets the atom arrays,
    ``frozen``, ``frozen_axes``, ``symprec`` and ``fix_com`` that any of them has (ASE's defaults:
    zeros, not frozen, no symmetry kept, centre of mass free), and an ``info`` key
    that not all of them have alike (missing in some, or of another kind or shape) is stored as
    JSON in all, empty where it is missing, so each structure comes back with its own keys.
    """
    optional = ("frozen", FROZEN_AXES, SYMPREC, FIX_COM, *ATOM_ARRAYS, *SYSTEM_INFO)
    for name in optional:
        have = [f for f in fields_list if name in f]
        if not have or len(have) == len(fields_list):
            continue
        like = have[0][name]
        for f in fields_list:
            if name not in f:
                n = 1 if name in (SYMPREC, FIX_COM, *SYSTEM_INFO) else int(f["atomic_numbers"].shape[0])
                f[name] = torch.zeros((n, *like.shape[1:]), dtype=like.dtype)
    forms: dict[str, set[tuple[Any, ...]]] = {}
    owners: list[dict[str, str]] = []  # per structure: info key -> its field name
    for f in fields_list:
        own = {_split_info(field)[1]: field for field in f if field.startswith(_INFO_PREFIXES)}
        owners.append(own)
        for key, field in own.items():
            value = f[field]
            forms.setdefault(key, set()).add((_split_info(field)[0], value.dtype, tuple(value.shape[1:])))
    for key, kinds in forms.items():
        if len(kinds) == 1 and all(key in own for own in owners):
            continue
        for f, own in zip(fields_list, owners, strict=True):
            text = _to_json(key, _info_value(own[key], f.pop(own[key]))) if key in own else ""
            f[JSON_PREFIX + key] = encode_text(text, key, JSON_WIDTH).unsqueeze(0)


def _split_info(field: str) -> tuple[str, str]:
    """``(prefix, key)`` of an info field's name."""
    for prefix in (TEXT_PREFIX, JSON_PREFIX, INFO_PREFIX):  # the longer prefixes first
        if field.startswith(prefix):
            return prefix, field[len(prefix):]
    raise ValueError(field)  # pragma: no cover - callers pass info fields only


#: What :func:`_info_value` gives for a structure without the key (its JSON row is empty).
_ABSENT = object()


def _info_value(field: str, value: torch.Tensor) -> Any:
    """The ``atoms.info`` value an info field's row holds (:data:`_ABSENT` for an empty JSON row:
    a structure batched with others that have this key, itself without it)."""
    from ase.io.jsonio import decode

    prefix, _ = _split_info(field)
    if prefix == TEXT_PREFIX:
        return decode_text(value[0])
    if prefix == JSON_PREFIX:
        text = decode_text(value[0])
        return decode(text) if text else _ABSENT
    row = value[0].numpy()
    return row.item() if row.ndim == 0 else row
