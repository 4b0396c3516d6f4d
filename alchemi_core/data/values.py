"""Physical checks on the values of known fields, shared by ``AtomicData`` and ``Batch``.

Positions, velocities and cells must be finite; masses must be finite and positive. (A test
``mass <= 0`` lets NaN through, since every comparison with NaN is false; these checks ask for
the good values instead.) They read values back, so they run when data is built or a field is
set, never inside a step.

Example:
    >>> import torch
    >>> from alchemi_core.data.values import check_values
    >>> from alchemi_core.errors import InvalidDataError
    >>> try:
    ...     check_values("atomic_masses", torch.tensor([1.0, float("nan")]))
    ... except InvalidDataError as exc:
    ...     print(str(exc).split(";")[0])
    atomic_masses must be finite and positive (amu), got nan at atom 1
"""

from __future__ import annotations

import math

import torch

from alchemi_core.errors import InvalidDataError

#: Fields whose every value must be finite (floating point only; integer fields always are).
FINITE_FIELDS = frozenset({"positions", "velocities", "cell"})


def check_values(name: str, t: torch.Tensor, where: str = "") -> None:
    """Raise when ``t`` holds values field ``name`` cannot have (see the module docstring).

    Args:
        name: The field.
        t: Its values.
        where: Appended to the message (``" in system 3"``).

    Raises:
        InvalidDataError: Non-finite positions, velocities or cell; masses that are not finite and
            positive. The message names the first offending row.
    """
    if name == "atomic_masses":
        if t.numel() and _sum_is_finite(t) and float(t.min()) > 0:
            return  # the usual case, in two reductions (every structure that enters a run pays this)
        ok = torch.isfinite(t) & (t > 0)
        if not bool(ok.all()):
            row = int(torch.nonzero(~ok.reshape(ok.shape[0], -1).all(dim=1))[0, 0])
            raise InvalidDataError(
                f"atomic_masses must be finite and positive (amu), got {t.reshape(t.shape[0], -1)[row, 0].item():g} "
                f"at atom {row}{where}; give every atom its mass, or leave the field out to use standard masses"
            )
    elif name in FINITE_FIELDS and t.dtype.is_floating_point and t.numel():
        if _sum_is_finite(t):
            return
        ok = torch.isfinite(t)
        if not bool(ok.all()):
            rows = torch.nonzero(~ok.reshape(ok.shape[0], -1).all(dim=1)).flatten()[:10].tolist()
            what = "systems" if name == "cell" else "atoms"
            raise InvalidDataError(
                f"{name} contain NaN or infinite values at {what} {rows}{where}; fix the structure before "
                "simulating it"
            )


def _sum_is_finite(t: torch.Tensor) -> bool:
    """True when every value is finite, in one reduction: NaN and inf survive a sum. A finite sum
    proves it; an infinite one may be an overflow of large finite values, so False only sends the
    caller to the exact test."""
    return math.isfinite(float(t.sum()))
