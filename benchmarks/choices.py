"""Settings chosen for one measurement and put back afterwards: the per-device defaults that live in
dicts (``pair_potential.UNROLL``, ``layout.SEARCH_TRIM``, ...) or attributes, so one process can
compare variants row by row.

A variant is written ``module:NAME[key]=value`` (or ``module:NAME.attr=value``), with ``module``
under ``alchemi_potentials`` unless it is dotted from a package root (``alchemi_core``, ``alchemi_zarr``,
``alchemi_integrators``, ``benchmarks``), and ``value`` a Python literal;
several settings of one variant are joined by ``,``.

Example:
    >>> from alchemi_potentials import pair_potential
    >>> before = pair_potential.UNROLL["cuda"]
    >>> with chosen(parse_variant("pair_potential:UNROLL[cuda]=2")):
    ...     pair_potential.UNROLL["cuda"]
    2
    >>> pair_potential.UNROLL["cuda"] == before
    True
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import re
from collections.abc import Iterator
from typing import Any

Choice = tuple[Any, str, Any]
#: Packages a variant's module may be named from; any other module is under alchemi_potentials.
_ROOTS = ("alchemi_potentials", "alchemi_integrators", "alchemi_core", "alchemi_zarr", "benchmarks")

_SETTING = re.compile(r"^\s*(?P<module>[\w.]+):(?P<name>\w+)(?:\[(?P<key>[^\]]+)\]|\.(?P<attr>\w+))?\s*=\s*(?P<value>.+?)\s*$")


@contextlib.contextmanager
def chosen(choices: list[Choice]) -> Iterator[None]:
    """Set each ``(owner, key, value)`` (a dict's item or an object's attribute) for the run, and
    put every old value back afterwards."""
    old: list[Choice] = []
    try:
        for owner, key, value in choices:
            old.append((owner, key, owner[key] if isinstance(owner, dict) else getattr(owner, key)))
            _put(owner, key, value)
        yield
    finally:
        for owner, key, value in reversed(old):
            _put(owner, key, value)


def parse_variant(text: str) -> list[Choice]:
    """``"pair_potential:UNROLL[cuda]=2,neighbors.layout:SEARCH_TRIM[cuda]=True"`` -> choices for
    :func:`chosen` (an empty text: the defaults)."""
    out: list[Choice] = []
    for setting in filter(None, (s.strip() for s in text.split(","))):
        m = _SETTING.match(setting)
        if m is None:
            raise ValueError(f"variant setting {setting!r}: write module:NAME[key]=value or module:NAME.attr=value")
        name = m["module"]
        module = importlib.import_module(name if name.split(".")[0] in _ROOTS else f"alchemi_potentials.{name}")
        owner = getattr(module, m["name"])
        value = ast.literal_eval(m["value"])
        if m["key"] is not None:
            out.append((owner, m["key"], value))
        elif m["attr"] is not None:
            out.append((owner, m["attr"], value))
        else:
            out.append((module, m["name"], value))
    return out


def _put(owner: Any, key: str, value: Any) -> None:
    if isinstance(owner, dict):
        owner[key] = value
    else:
        setattr(owner, key, value)
