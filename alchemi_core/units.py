"""Units: eV, Å, fs (public time), amu, K. Pressure in eV/Å³; stress is positive under tension.

The one conversion the integrators need is from force/mass to acceleration:
``a [Å/fs²] = F [eV/Å] / m [amu] * ACCELERATION``.

Example:
    >>> from alchemi_core import units
    >>> round(units.KB, 8)      # Boltzmann constant in eV/K
    8.617e-05
    >>> round(1.0 * units.EV_PER_A3_TO_GPA, 2)
    160.22
    >>> round(2.0 * units.GPA, 6)          # 2 GPa in eV/Å³
    0.012483
    >>> round(units.pressure_in(0.0125, "bar"), 1)
    20027.2
"""

from __future__ import annotations

#: Boltzmann constant, eV/K.
KB = 8.617333262e-5
#: (eV/Å)/amu expressed in Å/fs²: 1 eV / (1 amu Å²) = 9.6485e27 s⁻².
ACCELERATION = 9.648533212331e-3
#: amu Å²/fs² in eV (kinetic energy of masses in amu moving at Å/fs).
AMU_A2_PER_FS2_TO_EV = 1.0 / ACCELERATION
#: One eV/Å³ in GPa and in bar.
EV_PER_A3_TO_GPA = 160.21766208
EV_PER_A3_TO_BAR = EV_PER_A3_TO_GPA * 1.0e4
#: One GPa and one bar in eV/Å³: ``pressure=1.5 * units.GPA`` is 1.5 GPa, and a compressibility of
#: 4.5e-5 per bar is ``4.5e-5 / units.BAR`` Å³/eV.
GPA = 1.0 / EV_PER_A3_TO_GPA
BAR = 1.0 / EV_PER_A3_TO_BAR


def pressure_to_ev_per_a3(value: float, unit: str = "GPa") -> float:
    """Convert a pressure in ``"GPa"``, ``"bar"`` or ``"eV/A3"`` to eV/Å³."""
    unit = unit.lower().replace("å", "a")
    if unit == "gpa":
        return value / EV_PER_A3_TO_GPA
    if unit == "bar":
        return value / EV_PER_A3_TO_BAR
    if unit in ("ev/a3", "ev/a^3"):
        return value
    raise ValueError(f"unknown pressure unit {unit!r}; use 'GPa', 'bar' or 'eV/A3'")


def pressure_in(value: float, unit: str = "GPa") -> float:
    """Convert a pressure in eV/Å³ to ``"GPa"``, ``"bar"`` or ``"eV/A3"`` (the inverse of
    :func:`pressure_to_ev_per_a3`)."""
    return value / pressure_to_ev_per_a3(1.0, unit)
