"""Units: eV, Å, fs (public time), amu, K. Pressure in eV/Å³; stress is positive under tension.

The one conversion the integrators need is from force/mass to acceleration:
``a [Å/fs²] = F [eV/Å] / m [amu] * ACCELERATION``.

Example:
    >>> from alchemi_core import units
    >>> round(units.KB, 8)      # Boltzmann constant in eV/K
    8.617e-05
    >>> round(1.0 * units.EV_PER_A3_TO_GPA, 2)
    160.22
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
