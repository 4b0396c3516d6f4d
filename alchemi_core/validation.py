"""Checks of configuration values, each failing with one error that names the parameter, the
value given and the fix.

Components call these when they are built, so a careless setting fails at once instead of being
rounded, clipped or ignored during a long run.

Example:
    >>> from alchemi_core.validation import whole_number, finite_number
    >>> whole_number("n_steps", 10.0, minimum=0)
    10
    >>> whole_number("n_steps", 2.7, minimum=0)
    Traceback (most recent call last):
    ...
    alchemi_core.errors.ConfigurationError: n_steps must be a whole number, got 2.7; pass an int such as 2 or 3
    >>> finite_number("threshold", float("nan"), minimum=0.0)
    Traceback (most recent call last):
    ...
    alchemi_core.errors.ConfigurationError: threshold must be a finite number, got nan; pass a real value >= 0.0
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from alchemi_core.errors import ConfigurationError


def whole_number(name: str, value: Any, *, minimum: int | None = None, none_means: str | None = None) -> int:
    """``value`` as an int, refusing fractions, bools, NaN and values below ``minimum``.

    Args:
        name: The parameter, as the user wrote it (``"n_steps"``, ``"HostMemory capacity"``).
        value: What was given: an int, or a float or tensor holding a whole number.
        minimum: Smallest allowed value.
        none_means: When None is allowed instead, what it means (for the message only).

    Raises:
        ConfigurationError: Not a whole number, or below ``minimum``.
    """
    alt = f" (or None for {none_means})" if none_means else ""
    if isinstance(value, bool) or value is None:
        raise ConfigurationError(f"{name} must be a whole number{alt}, got {value!r}")
    if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
        value = value.item()
    real = isinstance(value, numbers.Real) and math.isfinite(float(value))
    if isinstance(value, numbers.Integral) or (real and float(value).is_integer()):
        out = int(value)
    elif isinstance(value, numbers.Real) and math.isfinite(float(value)):
        low = math.floor(float(value))
        raise ConfigurationError(
            f"{name} must be a whole number, got {value!r}; pass an int such as {low} or {low + 1}{alt}"
        )
    else:
        raise ConfigurationError(f"{name} must be a whole number{alt}, got {value!r}")
    if minimum is not None and out < minimum:
        raise ConfigurationError(f"{name} must be >= {minimum}{alt}, got {value!r}")
    return out


def finite_number(
    name: str, value: Any, *, minimum: float | None = None, above: float | None = None, unit: str = ""
) -> float:
    """``value`` as a float, refusing NaN, infinities and values out of range.

    Args:
        name: The parameter, as the user wrote it.
        value: What was given.
        minimum: Smallest allowed value (inclusive).
        above: The value must be strictly greater than this.
        unit: Appended to numbers in the message (``" fs"``, ``" eV/Å"``).

    Raises:
        ConfigurationError: Not a real number, not finite, or out of range.
    """
    bound = f">= {minimum}{unit}" if minimum is not None else (f"> {above}{unit}" if above is not None else "")
    want = f"a real value {bound}".rstrip()
    if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigurationError(f"{name} must be a number, got {value!r}; pass {want}")
    out = float(value)
    if not math.isfinite(out):
        raise ConfigurationError(f"{name} must be a finite number, got {value!r}; pass {want}")
    if (minimum is not None and out < minimum) or (above is not None and out <= above):
        raise ConfigurationError(f"{name} must be {bound}, got {value!r}")
    return out
