"""Settings of the benchmarks' own modules chosen for one measurement and put back afterwards
(``benchmarks.spec``'s values that the adapters read), so one process can compare variants row by
row. alchemi's per-device choices are not set here: ``--tuning`` builds a ``Tuning`` the adapters
pass to what they build (``benchmarks.tunings``).

A variant is written ``module:NAME[key]=value`` (or ``module:NAME.attr=value``), with ``module``
dotted from ``benchmarks``, and ``value`` a Python literal; several settings of one variant are
joined by ``,``.

Example:
    >>> from benchmarks import spec
    >>> before = spec.COLUMNS_HEADROOM
    >>> with chosen(parse_variant("benchmarks.spec:COLUMNS_HEADROOM=1.5")):
    ...     spec.COLUMNS_HEADROOM
    1.5
    >>> spec.COLUMNS_HEADROOM == before
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
#: The package a variant's module must be in (alchemi's own choices go through a Tuning).
_ROOTS = ("benchmarks",)

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
    """``"benchmarks.spec:COLUMNS_HEADROOM=1.3,benchmarks.spec:SKIN=1.0"`` -> choices for
    :func:`chosen` (an empty text: the defaults)."""
    out: list[Choice] = []
    for setting in filter(None, (s.strip() for s in text.split(","))):
        m = _SETTING.match(setting)
        if m is None:
            raise ValueError(f"variant setting {setting!r}: write module:NAME[key]=value or module:NAME.attr=value")
        name = m["module"]
        if name.split(".")[0] not in _ROOTS:
            raise ValueError(f"variant setting {setting!r}: only benchmarks.* modules; alchemi's per-device choices "
                             "are --tuning name=value settings (benchmarks.tunings)")
        module = importlib.import_module(name)
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
