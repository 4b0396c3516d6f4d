"""Per-species parameters of pair potentials: a number (every species) or a table ``{atomic
number or symbol: value}`` per parameter, with optional per-pair overrides. A pair of different
species mixes its value by ``"lorentz-berthelot"`` (energies geometric, lengths and inverse lengths
arithmetic mean) or ``"geometric"`` (all geometric).

Example:
    >>> t = pair_table({"epsilon": {18: 0.0104, 36: 0.0141}, "sigma": {18: 3.405, 36: 3.65}},
    ...                kinds={"epsilon": "energy", "sigma": "length"}, model="lennard-jones")
    >>> t.species, round(float(t.values["sigma"][0, 1]), 4)
    ((18, 36), 3.5275)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from alchemi_core.errors import ConfigurationError

MIXING_RULES = ("lorentz-berthelot", "geometric")
#: Atomic numbers a type lookup table covers (0 = padding atoms .. 118).
MAX_ATOMIC_NUMBER = 118


@attrs.frozen
class PairTable:
    """Symmetric ``[T, T]`` float64 tables of every parameter (``values``), for the species in
    ``species`` order (None: one set, T = 1, for every element)."""

    species: tuple[int, ...] | None
    values: dict[str, np.ndarray]

    @property
    def num_types(self) -> int:
        return 1 if self.species is None else len(self.species)

    def type_lookup(self) -> np.ndarray:
        """``[MAX_ATOMIC_NUMBER + 1]`` int32: the type of each element; ``num_types`` (the row of
        NaN parameters) for elements without parameters."""
        if self.species is None:
            return np.zeros(MAX_ATOMIC_NUMBER + 1, dtype=np.int32)
        lut = np.full(MAX_ATOMIC_NUMBER + 1, self.num_types, dtype=np.int32)
        for t, z in enumerate(self.species):
            lut[z] = t
        return lut


def pair_table(
    params: Mapping[str, Any],
    *,
    kinds: Mapping[str, str],
    model: str,
    overrides: Mapping[str, Mapping[tuple[Any, Any], float] | None] | None = None,
    mixing: str = "lorentz-berthelot",
    species: Sequence[Any] | None = None,
) -> PairTable:
    """Build the tables of a pair potential.

    Args:
        params: Parameter name -> number or ``{element: value}``.
        kinds: Parameter name -> ``"energy"``, ``"length"`` or ``"inverse-length"`` (how it mixes).
        model: The model's name, for messages.
        overrides: Parameter name -> ``{(element, element): value}`` for chosen pairs.
        mixing: ``"lorentz-berthelot"`` or ``"geometric"``.
        species: The elements a model given only numbers applies to (None: every element).

    Raises:
        ConfigurationError: A non-positive or non-finite value, tables with different elements,
            an unknown mixing rule, or an override for an element without parameters.
    """
    if mixing not in MIXING_RULES:
        raise ConfigurationError(f"{model}: unknown mixing rule {mixing!r}; use one of {list(MIXING_RULES)}")
    tables = {k: v for k, v in params.items() if isinstance(v, Mapping)}
    keys: list[int] | None = None
    for name, table in tables.items():
        zs = sorted(_atomic_number(z, model, name) for z in table)
        if keys is None:
            keys = zs
        elif zs != keys:
            raise ConfigurationError(
                f"{model}: the tables of {sorted(tables)} must list the same elements; "
                f"{name!r} has {zs} but another has {keys}"
            )
    if keys is not None and species is not None:
        raise ConfigurationError(f"{model}: give species= only when every parameter is a single number")
    if keys is None and species is not None:
        keys = sorted({_atomic_number(z, model, "species") for z in species})
        if not keys:
            raise ConfigurationError(f"{model}: species= must name at least one element")
    n = 1 if keys is None else len(keys)
    values: dict[str, np.ndarray] = {}
    for name, kind in kinds.items():
        raw = params[name]
        if isinstance(raw, Mapping):
            per = np.array([_positive(_entry(raw, z), model, f"{name}[{z}]") for z in keys or []])
        else:
            per = np.full(n, _positive(raw, model, name))
        values[name] = _mix(per, kind, mixing)
    for name, pairs in (overrides or {}).items():
        if not pairs:
            continue
        if keys is None:
            raise ConfigurationError(
                f"{model}: pair_{name} needs per-element tables (or species=) to say which elements it names"
            )
        for pair, value in pairs.items():
            if len(pair) != 2:
                raise ConfigurationError(f"{model}: pair_{name} keys are pairs of elements, got {pair!r}")
            za, zb = (_atomic_number(z, model, f"pair_{name}") for z in pair)
            for z in (za, zb):
                if z not in keys:
                    raise ConfigurationError(
                        f"{model}: pair_{name} names element {z}, which has no parameters; known: {keys}"
                    )
            a, b = keys.index(za), keys.index(zb)
            values[name][a, b] = values[name][b, a] = _positive(value, model, f"pair_{name}[{pair}]")
    return PairTable(species=None if keys is None else tuple(keys), values=values)


def _entry(table: Mapping[Any, Any], z: int) -> Any:
    """The entry of ``table`` for element ``z``, whether keyed by number or by symbol."""
    for key, value in table.items():
        if _atomic_number(key, "", "") == z:
            return value
    raise KeyError(z)  # pragma: no cover - keys were collected from the same table


def _mix(per_species: np.ndarray, kind: str, mixing: str) -> np.ndarray:
    a, b = per_species[:, None], per_species[None, :]
    if mixing == "geometric" or kind == "energy":
        return np.sqrt(a * b)
    if kind in ("length", "inverse-length"):
        return 0.5 * (a + b)
    raise ConfigurationError(f"unknown parameter kind {kind!r}")  # pragma: no cover - internal


def _positive(value: Any, model: str, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"{model}: {name} must be a number, got {value!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise ConfigurationError(f"{model}: {name} must be positive and finite, got {value!r}")
    return v


def _atomic_number(key: Any, model: str, name: str) -> int:
    if isinstance(key, str):
        try:
            from ase.data import atomic_numbers
        except ImportError:  # pragma: no cover - depends on the environment
            raise ConfigurationError(
                f"{model}: {name} uses the element symbol {key!r}; use atomic numbers, or install ase"
            ) from None
        if key not in atomic_numbers:
            raise ConfigurationError(f"{model}: {name} names unknown element {key!r}")
        return int(atomic_numbers[key])
    try:
        z = int(key)
    except (TypeError, ValueError):
        z = -1
    if z != key or not 1 <= z <= MAX_ATOMIC_NUMBER:
        raise ConfigurationError(f"{model}: {name} names atomic number {key!r}; use 1..{MAX_ATOMIC_NUMBER}")
    return z
