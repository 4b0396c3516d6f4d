"""Warp kernels that turn a neighbour matrix into energies, forces and virials for any pair
potential of this package.

One thread per slot (an atom, in the list's bin order) walks its column of packed entries
(``[max_neighbors, atoms]``, so a warp's reads are coalesced; one int32 per neighbour) and
accumulates, for every neighbour within the cutoff at ``d = wrapped[u] - wrapped[t] + m @ cell``,

* the force ``F_i += g d`` with ``g = U'(r) / r``,
* half the pair energy ``U(r)`` (each pair is seen from both ends),
* half the virial ``g d (x) d`` (``(x)``: outer product),

then writes its atom's force and adds its energy and virial to its system's total: directly
(one atomic add per atom, fine while systems are small) or, for large systems, into per-slot
sums that ``fold_totals`` adds up chunk by chunk (one atomic add per chunk: thousands of atoms
adding into one address would queue behind each other). With a half list (each pair once: the
CPU's default, where a kernel runs its threads one after another) it takes the whole energy and
virial and also subtracts ``g d`` from the neighbour's force. Stress is the virial over the cell
volume: positive under tension, as in ASE.

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

from alchemi_potentials.neighbors.entries import entry_image, entry_slot, image_bits_for
from alchemi_potentials.neighbors.kernels import PairList

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


@wp.func
def add_pair(
    kind: int,
    d: Any,
    u: int,
    lists: PairList,
    type_lut: wp.array(dtype=wp.int32),
    unknown: int,
    one_type: int,
    row_base: int,
    params: wp.array2d(dtype=Any),
    pa: Any,
    pb: Any,
    pc: Any,
    ps: Any,
    cutoff_sq: Any,
    switching: int,
    switch_on: Any,
    cutoff: Any,
    want_virial: int,
    half: int,
    forces: wp.array(dtype=Any),
    e: Any,
    f: Any,
    w: Any,
):
    """Energy, force and virial sums after adding the pair at displacement ``d`` (neighbour slot
    ``u``); with a half list the neighbour gets the opposite force (Newton's third law)."""
    r2 = wp.dot(d, d)
    e_out = e
    f_out = f
    w_out = w
    if r2 < cutoff_sq:
        a = pa
        b = pb
        c = pc
        shift = ps
        if one_type == 0:
            row = row_base + type_of(type_lut, lists.slot_number[u], unknown)
            a = params[row, 0]
            b = params[row, 1]
            c = params[row, 2]
            shift = params[row, 3]
        energy, g = pair_terms(kind, r2, a, b, c)
        energy = energy - shift
        if switching != 0:
            energy, g = switched(energy, g, r2, switch_on, cutoff)
        fij = g * d
        e_out = e + energy
        f_out = f + fij
        if half != 0:
            wp.atomic_sub(forces, lists.order[u], fij)  # plain adds on a CPU
        if want_virial != 0:
            w_out = w + wp.outer(fij, d)
    return e_out, f_out, w_out


@wp.kernel
def pair_forces(
    kind: int,
    wrapped: wp.array(dtype=Any),
    cell: wp.array(dtype=Any),
    lists: PairList,
    type_lut: wp.array(dtype=wp.int32),
    unknown: int,
    table_stride: int,
    one_type: int,
    params: wp.array2d(dtype=Any),
    cutoff_sq: Any,
    switch_on: Any,
    cutoff: Any,
    switching: int,
    want_virial: int,
    half: int,
    per_slot: int,
    forces: wp.array(dtype=Any),
    energy: wp.array(dtype=Any),
    virial: wp.array(dtype=Any),
    slot_energy: wp.array(dtype=Any),
    slot_virial: wp.array(dtype=Any),
):
    t = wp.tid()
    s = lists.system[t]
    yi = wrapped[t]
    m = cell[s]
    first = lists.first_atom[s]
    bits = lists.index_bits[s]
    ibits = image_bits_for(bits)
    zero = cutoff_sq - cutoff_sq
    f = yi * zero
    w = m * zero
    e = zero
    ti = type_of(type_lut, lists.slot_number[t], unknown)
    row_base = ti * table_stride
    # With one species the parameters are loop constants.
    pa = params[row_base + ti, 0]
    pb = params[row_base + ti, 1]
    pc = params[row_base + ti, 2]
    ps = params[row_base + ti, 3]
    n = lists.count[t]
    # Two neighbours per iteration: both entries and both positions are loaded before either
    # pair is computed, so each thread keeps two memory reads in flight instead of one. (Rows
    # have an even number of columns and every entry is valid, so entry k + 1 may be read.)
    for k in range(0, n, 2):
        c0 = lists.entries[k, t]
        c1 = lists.entries[k + 1, t]
        u0 = first + entry_slot(c0, bits)
        u1 = first + entry_slot(c1, bits)
        d0 = wrapped[u0] - yi + image_vector(entry_image(c0, bits, ibits), m)
        d1 = wrapped[u1] - yi + image_vector(entry_image(c1, bits, ibits), m)
        e, f, w = add_pair(kind, d0, u0, lists, type_lut, unknown, one_type, row_base, params, pa, pb, pc, ps,
                           cutoff_sq, switching, switch_on, cutoff, want_virial, half, forces, e, f, w)
        if k + 1 < n:
            e, f, w = add_pair(kind, d1, u1, lists, type_lut, unknown, one_type, row_base, params, pa, pb, pc, ps,
                               cutoff_sq, switching, switch_on, cutoff, want_virial, half, forces, e, f, w)
    # A full list sees every pair twice, a half list once.
    weight = type(zero)(0.5)
    i = lists.order[t]
    if half != 0:
        weight = type(zero)(1.0)
        wp.atomic_add(forces, i, f)
    else:
        forces[i] = f
    if per_slot != 0:
        slot_energy[t] = weight * e
        if want_virial != 0:
            slot_virial[t] = weight * w
    else:
        wp.atomic_add(energy, s, weight * e)
        if want_virial != 0:
            wp.atomic_add(virial, s, weight * w)


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


for _scalar, _vec, _mat in ((wp.float32, wp.vec3f, wp.mat33f), (wp.float64, wp.vec3d, wp.mat33d)):
    wp.overload(zero_totals, {"energy": wp.array(dtype=_scalar), "virial": wp.array(dtype=_mat)})
    wp.overload(zero_forces, {"forces": wp.array(dtype=_vec)})
    _totals = {"energy": wp.array(dtype=_scalar), "virial": wp.array(dtype=_mat)}
    wp.overload(
        pair_forces,
        {
            "wrapped": wp.array(dtype=_vec),
            "cell": wp.array(dtype=_mat),
            "params": wp.array2d(dtype=_scalar),
            "cutoff_sq": _scalar,
            "switch_on": _scalar,
            "cutoff": _scalar,
            "forces": wp.array(dtype=_vec),
            "slot_energy": wp.array(dtype=_scalar),
            "slot_virial": wp.array(dtype=_mat),
            **_totals,
        },
    )
    wp.overload(fold_totals, {"slot_energy": wp.array(dtype=_scalar), "slot_virial": wp.array(dtype=_mat), **_totals})
    wp.overload(virial_to_stress, {"cell": wp.array(dtype=_mat), "virial": wp.array(dtype=_mat), "stress": wp.array(dtype=_mat)})
