"""Warp kernels that turn a dense neighbour matrix into energies, forces and virials for any
pair potential of this package.

One thread per atom walks its own neighbour column (``[max_neighbors, atoms]``, so a warp's reads
are coalesced) and accumulates, for every neighbour ``j`` within the cutoff,

* the force ``F_i += g d`` with ``d = x_j - x_i`` (image included) and ``g = U'(r) / r``,
* half the pair energy ``U(r)`` (each pair is seen from both ends),
* half the virial ``g d (x) d`` (``(x)``: outer product),

then writes its force and adds its energy and virial to its system's total. With a half list
(each pair once: the CPU's default, where a kernel runs its threads one after another) it takes
the whole energy and virial and also subtracts ``g d`` from ``F_j``. Stress is the virial over
the cell volume: positive under tension, as in ASE.

A parameter row per pair of species types holds ``(a, b, c, shift)``:

* Lennard-Jones (kind 0): ``a = 4 epsilon``, ``b = sigma^2``;
  ``U = a ((b/r^2)^6 - (b/r^2)^3)``.
* Morse (kind 1): ``a = D``, ``b = alpha``, ``c = r0``; ``U = D (x^2 - 2 x)``,
  ``x = exp(-alpha (r - r0))``.

``shift`` is subtracted from every pair energy (the energy at the cutoff when shifting, else 0).
With switching on, the energy is multiplied by the quintic smoothstep ``S(t) = 10 t^3 - 15 t^4 +
6 t^5`` of ``t = (r_cut - r) / (r_cut - r_on)`` between the onset ``r_on`` and the cutoff, so
energy and forces both go to zero continuously.
"""

from __future__ import annotations

from typing import Any

import warp as wp

from alchemi_potentials.neighbors.kernels import decode_shift

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


@wp.kernel
def pair_forces(
    kind: int,
    positions: wp.array(dtype=Any),
    cell: wp.array(dtype=Any),
    atom_system: wp.array(dtype=wp.int32),
    atom_type: wp.array(dtype=wp.int32),
    table_stride: int,
    one_type: int,
    params: wp.array2d(dtype=Any),
    cutoff_sq: Any,
    switch_on: Any,
    cutoff: Any,
    switching: int,
    neighbor_index: wp.array2d(dtype=wp.int32),
    neighbor_shift: wp.array2d(dtype=wp.int32),
    neighbor_count: wp.array(dtype=wp.int32),
    want_virial: int,
    half: int,
    forces: wp.array(dtype=Any),
    energy: wp.array(dtype=Any),
    virial: wp.array(dtype=Any),
):
    i = wp.tid()
    s = atom_system[i]
    xi = positions[i]
    m = cell[s]
    zero = cutoff_sq - cutoff_sq
    f = xi * zero
    w = m * zero
    e = zero
    ti = atom_type[i]
    row = ti * table_stride + ti
    # With one species the parameters are loop constants.
    pa = params[row, 0]
    pb = params[row, 1]
    pc = params[row, 2]
    ps = params[row, 3]
    for k in range(neighbor_count[i]):
        j = neighbor_index[k, i]
        # Always apply the shift (zero for most pairs): cheaper than a branch that half the
        # pairs of a small cell take, on a CPU (misprediction) and a GPU (divergence) alike.
        n = decode_shift(neighbor_shift[k, i])
        d = positions[j] - xi + type(zero)(n[0]) * m[0] + type(zero)(n[1]) * m[1] + type(zero)(n[2]) * m[2]
        r2 = wp.dot(d, d)
        if r2 < cutoff_sq:
            if one_type == 0:
                row = ti * table_stride + atom_type[j]
                pa = params[row, 0]
                pb = params[row, 1]
                pc = params[row, 2]
                ps = params[row, 3]
            u, g = pair_terms(kind, r2, pa, pb, pc)
            u = u - ps
            if switching != 0:
                u, g = switched(u, g, r2, switch_on, cutoff)
            e += u
            fij = g * d
            f += fij
            if half != 0:
                wp.atomic_sub(forces, j, fij)  # Newton's third law; plain adds on a CPU
            if want_virial != 0:
                w += wp.outer(fij, d)
    # A full list sees every pair twice, a half list once.
    weight = type(zero)(0.5)
    if half != 0:
        weight = type(zero)(1.0)
        wp.atomic_add(forces, i, f)
    else:
        forces[i] = f
    wp.atomic_add(energy, s, weight * e)
    if want_virial != 0:
        wp.atomic_add(virial, s, weight * w)


@wp.kernel
def virial_to_stress(cell: wp.array(dtype=Any), virial: wp.array(dtype=Any), stress: wp.array(dtype=Any)):
    """Stress = virial / |det(cell)|; NaN where the cell has no volume (stress is undefined)."""
    s = wp.tid()
    volume = wp.abs(wp.determinant(cell[s]))
    if volume > volume - volume:
        stress[s] = virial[s] / volume
    else:
        stress[s] = virial[s] * type(volume)(wp.nan)


for _scalar, _vec, _mat in ((wp.float32, wp.vec3f, wp.mat33f), (wp.float64, wp.vec3d, wp.mat33d)):
    wp.overload(zero_totals, {"energy": wp.array(dtype=_scalar), "virial": wp.array(dtype=_mat)})
    wp.overload(zero_forces, {"forces": wp.array(dtype=_vec)})
    wp.overload(
        pair_forces,
        {
            "positions": wp.array(dtype=_vec),
            "cell": wp.array(dtype=_mat),
            "params": wp.array2d(dtype=_scalar),
            "cutoff_sq": _scalar,
            "switch_on": _scalar,
            "cutoff": _scalar,
            "forces": wp.array(dtype=_vec),
            "energy": wp.array(dtype=_scalar),
            "virial": wp.array(dtype=_mat),
        },
    )
    wp.overload(virial_to_stress, {"cell": wp.array(dtype=_mat), "virial": wp.array(dtype=_mat), "stress": wp.array(dtype=_mat)})
