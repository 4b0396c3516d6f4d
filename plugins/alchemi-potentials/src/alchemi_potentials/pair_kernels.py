"""Warp functions and kernels around the pair sum (:mod:`alchemi_potentials.pair_forces`).

A parameter row per pair of species types holds ``(a, b, c, shift, slope)``: Lennard-Jones (kind 0)
``a = 4 epsilon``, ``b = sigma^2``, ``U = a ((b/r^2)^6 - (b/r^2)^3)``; Morse (kind 1) ``a = D``,
``b = alpha``, ``c = r0``, ``U = D (x^2 - 2 x)``, ``x = exp(-alpha (r - r0))``. ``shift`` is
subtracted from every pair energy, and ``slope r`` too under a force shift. The switch multiplies energies by ``S(t) = 10 t^3 - 15 t^4 +
6 t^5``, ``t = (r_cut - r) / (r_cut - r_on)``.
"""

from __future__ import annotations

from typing import Any

import warp as wp

wp.set_module_options({"enable_backward": False})

LENNARD_JONES = 0
MORSE = 1


@wp.func
def pair_terms(kind: int, r2: Any, a: Any, b: Any, c: Any):
    """The pair energy ``U`` and ``U'(r) / r`` at squared distance ``r2``."""
    if kind == 0:
        s2 = b / r2
        s6 = s2 * s2 * s2
        return a * (s6 * s6 - s6), a * (type(r2)(6.0) * s6 - type(r2)(12.0) * s6 * s6) / r2
    r = wp.sqrt(r2)
    x = wp.exp(b * (c - r))
    return a * x * (x - type(r2)(2.0)), type(r2)(2.0) * a * b * x * (type(r2)(1.0) - x) / r


@wp.func
def switched(u: Any, g: Any, r2: Any, r_on: Any, r_cut: Any):
    """``U S`` and its ``d/dr / r``, with ``S`` the smoothstep from 1 at ``r_on`` to 0 at ``r_cut``."""
    r = wp.sqrt(r2)
    if r <= r_on:
        return u, g
    one = type(r2)(1.0)
    t = (r_cut - r) / (r_cut - r_on)
    s = t * t * t * (t * (t * type(r2)(6.0) - type(r2)(15.0)) + type(r2)(10.0))
    # dS/dr = dS/dt * dt/dr = 30 t^2 (1 - t)^2 * (-1 / (r_cut - r_on))
    ds = -type(r2)(30.0) * t * t * (one - t) * (one - t) / (r_cut - r_on)
    return u * s, g * s + u * ds / r


@wp.kernel
def zero_totals(energy: wp.array(dtype=Any), virial: wp.array(dtype=Any)):
    s = wp.tid()
    # Constructed zeros, not x - x: a NaN from an earlier step must not survive.
    energy[s] = type(energy[s])(0.0)
    virial[s] = type(virial[s])()


@wp.kernel
def zero_forces(forces: wp.array(dtype=Any)):
    i = wp.tid()
    forces[i] = type(forces[i])()


@wp.func
def type_of(lut: wp.array(dtype=wp.int32), z: int, unknown: int):
    """The parameter type of atomic number ``z`` (``unknown``, a NaN row, beyond the table)."""
    if z < 0 or z >= lut.shape[0]:
        return unknown
    return lut[z]


@wp.func
def image_vector(n: wp.vec3i, m: Any):
    """``n @ m``: the lattice vector of image ``n`` in the cell's precision."""
    return type(m[0, 0])(n[0]) * m[0] + type(m[0, 0])(n[1]) * m[1] + type(m[0, 0])(n[2]) * m[2]


@wp.kernel
def fold_totals(
    chunks: wp.array2d(dtype=wp.int32),
    slot_energy: wp.array(dtype=Any),
    slot_virial: wp.array(dtype=Any),
    want_virial: int,
    energy: wp.array(dtype=Any),
    virial: wp.array(dtype=Any),
):
    """Sum per-slot energies (and virials) over a chunk of one system's slots into the system:
    a large system then takes one atomic add per chunk instead of one per atom."""
    c = wp.tid()
    first = chunks[c, 0]
    last = chunks[c, 1]
    s = chunks[c, 2]
    e = slot_energy[first]
    for t in range(first + 1, last):
        e += slot_energy[t]
    wp.atomic_add(energy, s, e)
    if want_virial != 0:
        w = slot_virial[first]
        for t in range(first + 1, last):
            w += slot_virial[t]
        wp.atomic_add(virial, s, w)


@wp.kernel
def virial_to_stress(cell: wp.array(dtype=Any), virial: wp.array(dtype=Any), stress: wp.array(dtype=Any)):
    """Stress = virial / |det(cell)|; NaN where the cell has no volume (stress is undefined)."""
    s = wp.tid()
    volume = wp.abs(wp.determinant(cell[s]))
    if volume > volume - volume:
        stress[s] = virial[s] / volume
    else:
        stress[s] = virial[s] * type(volume)(wp.nan)


@wp.kernel
def count_types(system: wp.array(dtype=wp.int32), slot_number: wp.array(dtype=wp.int32),
                lut: wp.array(dtype=wp.int32), unknown: int, counts: wp.array(dtype=Any)):
    """Atoms of each type per system (``counts[s * (unknown + 1) + type]``), from the list's slots:
    they follow systems entering and leaving a batch."""
    t = wp.tid()
    wp.atomic_add(counts, system[t] * (unknown + 1) + type_of(lut, slot_number[t], unknown), type(counts[0])(1.0))


@wp.kernel
def add_tail(
    cell: wp.array(dtype=Any),
    counts: wp.array(dtype=Any),
    n_types: int,
    tail_energy: wp.array(dtype=Any),
    tail_pressure: wp.array(dtype=Any),
    want_stress: int,
    energy: wp.array(dtype=Any),
    stress: wp.array(dtype=Any),
):
    """Add the analytic tail: ``energy += sum_ij N_i N_j e_ij / V`` and ``stress -= sum_ij N_i N_j
    p_ij / V^2`` on the diagonal (tables ``[n_types^2]``); then zero the system's counts."""
    s = wp.tid()
    volume = wp.abs(wp.determinant(cell[s]))
    base = s * n_types
    ke = volume - volume
    kp = ke
    for i in range(n_types):
        ci = counts[base + i]
        for j in range(n_types):
            nn = ci * counts[base + j]
            ke += nn * tail_energy[i * n_types + j]
            kp += nn * tail_pressure[i * n_types + j]
    for i in range(n_types):
        counts[base + i] = volume - volume
    energy[s] = energy[s] + ke / volume
    if want_stress != 0:
        p = kp / (volume * volume)
        z = p - p
        stress[s] = stress[s] - type(cell[s])(p, z, z, z, p, z, z, z, p)


for _scalar, _vec, _mat in ((wp.float32, wp.vec3f, wp.mat33f), (wp.float64, wp.vec3d, wp.mat33d)):
    wp.overload(zero_totals, {"energy": wp.array(dtype=_scalar), "virial": wp.array(dtype=_mat)})
    wp.overload(zero_forces, {"forces": wp.array(dtype=_vec)})
    _totals = {"energy": wp.array(dtype=_scalar), "virial": wp.array(dtype=_mat)}
    wp.overload(fold_totals, {"slot_energy": wp.array(dtype=_scalar), "slot_virial": wp.array(dtype=_mat), **_totals})
    wp.overload(count_types, {"counts": wp.array(dtype=_scalar)})
    wp.overload(add_tail, {"cell": wp.array(dtype=_mat), "counts": wp.array(dtype=_scalar), "tail_energy": wp.array(dtype=_scalar),
                           "tail_pressure": wp.array(dtype=_scalar), "energy": wp.array(dtype=_scalar),
                           "stress": wp.array(dtype=_mat)})
    wp.overload(virial_to_stress, {"cell": wp.array(dtype=_mat), "virial": wp.array(dtype=_mat), "stress": wp.array(dtype=_mat)})
