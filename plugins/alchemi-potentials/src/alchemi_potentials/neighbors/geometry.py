"""Warp functions for the geometry of the cell list: binning frames, bins per axis, and which
bins (and periodic images) lie within reach of a bin.

Periodic axes are cut into bins about half a list radius thick. Open axes have no extent to cut:
their bins are half a radius wide and *hashed* (bin = floor(distance / width) mod n), so any
spread of atoms costs O(atoms) without a reduction to size the grid.
"""

from __future__ import annotations

from typing import Any

import warp as wp

wp.set_module_options({"enable_backward": False})

#: Bins searched either side on a hashed axis (bins are half a radius wide).
HASHED_REACH = 2


@wp.func
def vec3d_of(x: Any):
    return wp.vec3d(wp.float64(x[0]), wp.float64(x[1]), wp.float64(x[2]))


@wp.func
def mat33d_of(m: Any):
    return wp.mat33d(
        wp.float64(m[0, 0]), wp.float64(m[0, 1]), wp.float64(m[0, 2]),
        wp.float64(m[1, 0]), wp.float64(m[1, 1]), wp.float64(m[1, 2]),
        wp.float64(m[2, 0]), wp.float64(m[2, 1]), wp.float64(m[2, 2]),
    )  # fmt: skip


@wp.func
def flag_of(b: wp.bool):
    if b:
        return 1
    return 0


@wp.func
def row_changed(m: wp.mat33d, ref: wp.mat33d, a: int):
    return m[a, 0] != ref[a, 0] or m[a, 1] != ref[a, 1] or m[a, 2] != ref[a, 2]


@wp.func
def floor_div(a: int, n: int):
    """Python's ``a // n`` for ``n > 0`` (rounds down, also for negative ``a``)."""
    q = a / n
    if q * n > a:
        q = q - 1
    return q


@wp.func
def floor_mod(a: int, n: int):
    """Python's ``a % n`` for ``n > 0`` (never negative)."""
    return a - floor_div(a, n) * n


@wp.func
def unit_or_zero(v: wp.vec3d):
    n = wp.length(v)
    if n > wp.float64(0.0):
        return v / n
    return v


@wp.func
def binning_basis(cell: wp.mat33d, pa: int, pb: int, pc: int):
    """The cell with each open row replaced by a unit vector normal to the periodic rows (an
    orthonormal frame when nothing is periodic): fractions on periodic axes, Å on open ones."""
    a = cell[0]
    b = cell[1]
    c = cell[2]
    n_periodic = pa + pb + pc
    if n_periodic == 0:
        return wp.identity(n=3, dtype=wp.float64)
    if n_periodic == 2:
        if pa == 0:
            a = unit_or_zero(wp.cross(b, c))
        if pb == 0:
            b = unit_or_zero(wp.cross(c, a))
        if pc == 0:
            c = unit_or_zero(wp.cross(a, b))
    if n_periodic == 1:
        p = a
        if pb != 0:
            p = b
        if pc != 0:
            p = c
        # The Cartesian axis least aligned with p gives a first normal; the second completes it.
        e = wp.vec3d(wp.float64(1.0), wp.float64(0.0), wp.float64(0.0))
        ax = wp.abs(p[0])
        if wp.abs(p[1]) < ax:
            e = wp.vec3d(wp.float64(0.0), wp.float64(1.0), wp.float64(0.0))
            ax = wp.abs(p[1])
        if wp.abs(p[2]) < ax:
            e = wp.vec3d(wp.float64(0.0), wp.float64(0.0), wp.float64(1.0))
        u = unit_or_zero(wp.cross(p, e))
        w = unit_or_zero(wp.cross(p, u))
        if pa != 0:
            b = u
            c = w
        if pb != 0:
            a = u
            c = w
        if pc != 0:
            a = u
            b = w
    return wp.mat33d(a[0], a[1], a[2], b[0], b[1], b[2], c[0], c[1], c[2])


@wp.func
def periodic_rows(m: wp.mat33d, p: wp.vec3i):
    """``m`` with its open rows zero: an open row may hold anything (even inf or NaN), and images
    never use it, but 0 * inf would still poison them."""
    out = wp.mat33d()
    for r in range(3):
        if p[r] != 0:
            out[r] = m[r]
    return out


@wp.func
def plane_spacings(inv: wp.mat33d):
    """Distance between lattice planes of each axis: 1 / |column of the inverse|."""
    return wp.vec3d(
        wp.float64(1.0) / wp.length(wp.vec3d(inv[0, 0], inv[1, 0], inv[2, 0])),
        wp.float64(1.0) / wp.length(wp.vec3d(inv[0, 1], inv[1, 1], inv[2, 1])),
        wp.float64(1.0) / wp.length(wp.vec3d(inv[0, 2], inv[1, 2], inv[2, 2])),
    )


@wp.func
def periodic_bins(spacing: wp.float64, radius: wp.float64, cap: int):
    """Bins about half a radius thick across a periodic axis (at least one, at most ``cap``)."""
    n = wp.floor(wp.float64(2.0) * spacing / radius)
    if not (n < wp.float64(cap)):  # also NaN (a degenerate cell, reported elsewhere)
        return cap
    return wp.max(1, int(n))


@wp.func
def periodic_reach(n: int, spacing: wp.float64, radius: wp.float64):
    """Bins to search either side on a periodic axis: a bin is spacing/n thick, so every image
    within ``radius`` lies within ceil(radius n / spacing) bins; -1 when absurd (a degenerate
    cell or NaN)."""
    r = wp.ceil(radius * wp.float64(n) / spacing)
    if not (r <= wp.float64(512.0)):
        return -1
    return int(r)


@wp.func
def hashed_bins(budget: wp.float64, axes: int):
    """Bins per hashed axis: the largest n with n^axes <= budget (at least one)."""
    if axes == 0:
        return 1
    n = wp.max(1, int(wp.pow(budget, wp.float64(1.0) / wp.float64(axes))))
    # pow rounds: step to the exact integer root.
    while wp.pow(wp.float64(n + 1), wp.float64(axes)) <= budget:
        n = n + 1
    while n > 1 and wp.pow(wp.float64(n), wp.float64(axes)) > budget:
        n = n - 1
    return n


@wp.func
def bin_product(n: wp.vec3i):
    return wp.float64(n[0]) * wp.float64(n[1]) * wp.float64(n[2])


@wp.func
def grid_dims(p: wp.vec3i, spacing: wp.vec3d, radius: wp.float64, cap: int):
    """Bins per axis within ``cap`` bins: periodic axes first (halving the finest until they
    fit), then hashed axes share what is left equally."""
    n = wp.vec3i(1, 1, 1)
    for k in range(3):
        if p[k] != 0:
            n[k] = periodic_bins(spacing[k], radius, cap)
    while bin_product(n) > wp.float64(cap):
        if n[0] >= n[1] and n[0] >= n[2]:
            n[0] = wp.max(1, n[0] / 2)
        elif n[1] >= n[2]:
            n[1] = wp.max(1, n[1] / 2)
        else:
            n[2] = wp.max(1, n[2] / 2)
    hashed = 3 - (p[0] + p[1] + p[2])
    m = hashed_bins(wp.float64(cap) / bin_product(n), hashed)
    for k in range(3):
        if p[k] == 0:
            n[k] = m
    return n


@wp.func
def search_span(reach: int, n: int, periodic: int):
    """Bins visited along an axis: 2 reach + 1 (repeats are other periodic images), but on a
    hashed axis never more than its n bins, each once (a repeat would count atoms twice)."""
    if periodic != 0:
        return 2 * reach + 1
    return wp.min(2 * reach + 1, n)


@wp.func
def neighbor_bin(c: int, offset: int, n: int, periodic: int):
    """Bin ``c + offset`` as (bin inside the grid, periodic image): wrapped with its image on a
    periodic axis, hashed (image 0) on the others."""
    v = c + offset
    if periodic != 0:
        m = floor_div(v, n)
        return v - m * n, m
    return floor_mod(v, n), 0


@wp.func
def hashed_cell(f: wp.float64, inv_width: wp.float64):
    """floor(f / width) kept within int range (NaN and absurd distances land in cell 0)."""
    v = f * inv_width
    if not (v > wp.float64(-1073741824.0) and v < wp.float64(1073741824.0)):
        return 0
    return int(wp.floor(v))
