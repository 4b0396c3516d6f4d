"""Standard atomic weights (amu) by atomic number, for structures given without masses.

Values are IUPAC conventional/abridged standard atomic weights; for elements without stable
isotopes, the mass number of the longest-lived isotope. Index 0 is a placeholder (1.0) so a
padding atom never divides by zero.

Example:
    >>> from alchemi_core.data.elements import ATOMIC_MASSES
    >>> ATOMIC_MASSES[18]
    39.948
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

ATOMIC_MASSES: tuple[float, ...] = (
    1.0,
    1.008, 4.0026, 6.94, 9.0122, 10.81, 12.011, 14.007, 15.999, 18.998, 20.180,  # 1-10
    22.990, 24.305, 26.982, 28.085, 30.974, 32.06, 35.45, 39.948, 39.098, 40.078,  # 11-20
    44.956, 47.867, 50.942, 51.996, 54.938, 55.845, 58.933, 58.693, 63.546, 65.38,  # 21-30
    69.723, 72.630, 74.922, 78.971, 79.904, 83.798, 85.468, 87.62, 88.906, 91.224,  # 31-40
    92.906, 95.95, 98.0, 101.07, 102.91, 106.42, 107.87, 112.41, 114.82, 118.71,  # 41-50
    121.76, 127.60, 126.90, 131.29, 132.91, 137.33, 138.91, 140.12, 140.91, 144.24,  # 51-60
    145.0, 150.36, 151.96, 157.25, 158.93, 162.50, 164.93, 167.26, 168.93, 173.05,  # 61-70
    174.97, 178.49, 180.95, 183.84, 186.21, 190.23, 192.22, 195.08, 196.97, 200.59,  # 71-80
    204.38, 207.2, 208.98, 209.0, 210.0, 222.0, 223.0, 226.0, 227.0, 232.04,  # 81-90
    231.04, 238.03, 237.0, 244.0,  # 91-94
)


#: The heaviest element named (oganesson); larger atomic numbers are no element.
LAST_ELEMENT = 118


def unknown_elements(numbers: Iterable[int]) -> str:
    """What is wrong with those of ``numbers`` that are no element (below 1 or above
    ``LAST_ELEMENT``; 0, a dummy atom, passes), or ``""`` when all are elements.

    Example:
        >>> unknown_elements([1, 119, -2])
        'atomic numbers [-2, 119] are unknown elements (elements are 1-118); fix the atomic numbers of the structures'
    """
    bad = sorted({int(z) for z in numbers if not 0 <= int(z) <= LAST_ELEMENT})
    if not bad:
        return ""
    return (f"atomic numbers {bad} are unknown elements (elements are 1-{LAST_ELEMENT}); "
            "fix the atomic numbers of the structures")


def masses_for(atomic_numbers: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Masses of every atom (same device), from the table.

    Raises:
        InvalidDataError: An atomic number is no element, or has no tabulated mass.
    """
    from alchemi_core.errors import InvalidDataError

    table = torch.tensor(ATOMIC_MASSES, dtype=dtype, device=atomic_numbers.device)
    if atomic_numbers.numel():
        zmin, zmax = torch.stack(torch.aminmax(atomic_numbers)).tolist()  # one read-back
        problem = unknown_elements((zmin, zmax))
        if problem:
            raise InvalidDataError(problem)
        if zmax >= len(ATOMIC_MASSES):
            raise InvalidDataError(
                f"atomic number {zmax} has no tabulated mass; give the batch an atomic_masses field"
            )
    return table[atomic_numbers]
