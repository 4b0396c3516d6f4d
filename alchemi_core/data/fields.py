"""Which level (atom, edge or system) each named field lives at.

A structure's data are tensors of three kinds: one row per atom (``positions``), one row per edge
(``neighbor_list``) or one row per system (``energy``, ``cell``). :class:`AtomicData` and
:class:`Batch` store each field at its level, so batching concatenates atom and edge rows and
stacks system rows. Known fields have a fixed level; a custom field's level is inferred from its
leading dimension, or fixed once with :func:`register_field`.

Example:
    >>> from alchemi_core.data.fields import Level, level_of, register_field
    >>> level_of("positions")
    <Level.NODE: 'node'>
    >>> register_field("dipole", "system")
    >>> level_of("dipole")
    <Level.SYSTEM: 'system'>
"""

from __future__ import annotations

import enum

from alchemi_core.errors import ConfigurationError


class Level(str, enum.Enum):
    """Where a field's rows live: one per atom, one per edge or one per system."""

    NODE = "node"
    EDGE = "edge"
    SYSTEM = "system"


#: ``[V, 3]`` bool: the Cartesian components of an atom held fixed (ASE's ``FixCartesian``; whole
#: atoms are ``frozen``, ASE's ``FixAtoms``). See ``alchemi_core.dynamics.constraints``.
FROZEN_AXES = "frozen_axes"
#: ``[B]`` float: a system above 0 keeps its space group found at this tolerance (Å; ASE's
#: ``FixSymmetry(atoms, symprec)``). See ``alchemi_core.dynamics.symmetry``.
SYMPREC = "symprec"
#: ``[B]`` bool: the system's centre of mass stays where it is (ASE's ``FixCom``).
FIX_COM = "fix_com"

#: Fields whose level never depends on a shape.
KNOWN_LEVELS: dict[str, Level] = {
    # one row per atom
    "atomic_numbers": Level.NODE,
    "positions": Level.NODE,
    "velocities": Level.NODE,
    "forces": Level.NODE,
    "atomic_masses": Level.NODE,
    "charges": Level.NODE,
    "node_attrs": Level.NODE,
    "frozen": Level.NODE,
    FROZEN_AXES: Level.NODE,
    # one row per edge
    "neighbor_list": Level.EDGE,
    "shifts": Level.EDGE,
    "neighbor_list_shifts": Level.EDGE,
    "edge_attrs": Level.EDGE,
    # one row per system
    "energy": Level.SYSTEM,
    "cell": Level.SYSTEM,
    "pbc": Level.SYSTEM,
    "stress": Level.SYSTEM,
    "virial": Level.SYSTEM,
    "status": Level.SYSTEM,
    "system_id": Level.SYSTEM,
    "fmax": Level.SYSTEM,
    "energy_change": Level.SYSTEM,
    SYMPREC: Level.SYSTEM,
    FIX_COM: Level.SYSTEM,
    "charge": Level.SYSTEM,
    "spin": Level.SYSTEM,
}

#: Edge fields that hold atom indices: batching offsets them by each system's first atom.
INDEX_FIELDS: frozenset[str] = frozenset({"neighbor_list"})

#: Fields the engine keeps per system for itself (steps used in the current stage, the energy at
#: the last check): engine state, not data about the structure. Components name their own state
#: fields when they register (``Registrar.add(state_fields=...)``); ``registry.engine_state_fields()``
#: gives the union.
ENGINE_STATE_FIELDS: frozenset[str] = frozenset({"stage_steps", "energy_prev"})

_registered: dict[str, Level] = {}


def register_field(name: str, level: Level | str) -> None:
    """Fix the level of a custom field for every later ``AtomicData`` and ``Batch``.

    Args:
        name: The field name.
        level: ``"node"``, ``"edge"`` or ``"system"``.

    Raises:
        ConfigurationError: If ``name`` is a known field registered at another level.
    """
    lvl = Level(level)
    known = KNOWN_LEVELS.get(name)
    if known is not None and known is not lvl:
        raise ConfigurationError(
            f"field {name!r} is a built-in {known.value}-level field and cannot be registered "
            f"as {lvl.value}-level; choose another name for the custom field"
        )
    _registered[name] = lvl


def level_of(name: str) -> Level | None:
    """The fixed level of ``name``, or None when it must be inferred from a shape."""
    return KNOWN_LEVELS.get(name) or _registered.get(name)


def infer_level(name: str, leading: int, num_nodes: int, num_edges: int, num_systems: int) -> Level:
    """The level of a field from its leading dimension, preferring atoms, then edges, then systems.

    Raises:
        InvalidDataError: If the leading dimension matches no level.
    """
    from alchemi_core.errors import InvalidDataError

    fixed = level_of(name)
    if fixed is not None:
        return fixed
    if leading == num_nodes:
        return Level.NODE
    if num_edges and leading == num_edges:
        return Level.EDGE
    if leading == num_systems:
        return Level.SYSTEM
    raise InvalidDataError(
        f"cannot tell the level of field {name!r}: its leading dimension is {leading}, but there "
        f"are {num_nodes} atoms, {num_edges} edges and {num_systems} systems; give it one row per "
        f"atom, edge or system, or call alchemi_core.data.register_field({name!r}, level)"
    )
