"""Warp kernels of the batched cell list (see :mod:`alchemi_potentials.neighbors.cell_list`).

One forward launches them in this order, every step, on every system; a system whose list is
still valid exits each build kernel at its first line, so nothing is decided on the host:

1. ``mark_moved`` (atoms): an atom that moved more than skin/2 since the last build flags its
   system.
2. ``begin_build`` (systems): a flagged system, or one whose cell or periodicity changed, starts
   a build: binning basis, its inverse, plane spacings, empty bounding box.
3. ``fractional_coordinates`` (atoms): fractional coordinates, wrapped on periodic axes; the
   bounding box of non-periodic axes.
4. ``grid_layout`` (systems): bins per axis (about half the list radius thick, at most the
   system's share of bin storage) and how many bins to search either side.
5. ``count_into_bins`` (atoms): each atom's bin and its slot in it.
6. (a ``torch.cumsum`` over the bin counts gives every bin's end in the sorted atom array)
7. ``sort_into_bins`` (atoms): atoms written in bin order; bin counts reset for the next build.
8. ``search_neighbors`` (atoms): one thread per atom walks the bins around its own, over
   periodic images, and writes its neighbours into a dense matrix (all of them, or in a half
   list only the pairs it owns).

Geometry is done in float64 whatever the positions' precision: a build is rare, and bins must
never lose an atom to rounding.

Neighbour ``k`` of atom ``i`` is ``idx[k, i]`` with lattice shift ``decode_shift(shift[k, i])``:
the displacement is ``x[j] - x[i] + shift @ cell``. The layout ``[max_neighbors, atoms]`` makes
the reads of a warp of threads (consecutive atoms, same ``k``) coalesced.
"""

from __future__ import annotations

from typing import Any

import warp as wp

wp.set_module_options({"enable_backward": False})


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


# A lattice shift is packed into one int32: 10 bits per axis, each offset by 512 (so +-511).
@wp.func
def encode_shift(sx: int, sy: int, sz: int):
    return (sx + 512) | ((sy + 512) << 10) | ((sz + 512) << 20)


@wp.func
def decode_shift(code: int):
    return wp.vec3i((code & 1023) - 512, ((code >> 10) & 1023) - 512, ((code >> 20) & 1023) - 512)


@wp.func
def unit_or_zero(v: wp.vec3d):
    n = wp.length(v)
    if n > wp.float64(0.0):
        return v / n
    return v


@wp.func
def binning_basis(cell: wp.mat33d, pa: int, pb: int, pc: int):
    """The cell with each non-periodic row replaced by a unit vector normal to the periodic
    rows (an orthonormal frame when nothing is periodic): shifts only ever use periodic rows, and
    a non-periodic row may be zero or arbitrary in the input."""
    a = cell[0]
    b = cell[1]
    c = cell[2]
    n_periodic = pa + pb + pc
    if n_periodic == 0:
        return wp.mat33d(
            wp.float64(1.0), wp.float64(0.0), wp.float64(0.0),
            wp.float64(0.0), wp.float64(1.0), wp.float64(0.0),
            wp.float64(0.0), wp.float64(0.0), wp.float64(1.0),
        )  # fmt: skip
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
def floor_div(a: int, n: int):
    """Python's ``a // n`` (rounding down, also for negative ``a``)."""
    return int(wp.floor(wp.float64(a) / wp.float64(n)))


@wp.func
def flag_of(b: wp.bool):
    if b:
        return 1
    return 0


@wp.func
def row_changed(m: wp.mat33d, ref: wp.mat33d, a: int):
    return m[a, 0] != ref[a, 0] or m[a, 1] != ref[a, 1] or m[a, 2] != ref[a, 2]


@wp.func
def axis_bins(periodic: int, spacing: wp.float64, lo: wp.float64, hi: wp.float64, radius: wp.float64, cap: wp.float64):
    """Bins along one axis, each about half a list radius thick, across the periodic plane
    spacing, or across the atoms' span on a non-periodic axis (min() keeps int() in range).

    Half-radius bins make the searched volume about (5/2)^3 radii^3 instead of the 3^3 of
    one-radius bins, and, unlike those, still subdivide a periodic cell smaller than two radii.
    """
    extent = spacing
    if periodic == 0:
        extent = wp.float64(0.0)
        if hi > lo:
            extent = (hi - lo) * spacing
    return wp.max(1, int(wp.min(wp.floor(wp.float64(2.0) * extent / radius), cap)))


@wp.func
def axis_reach(periodic: int, n: int, spacing: wp.float64, lo: wp.float64, hi: wp.float64, radius: wp.float64):
    """Bins to search either side: a bin is spacing/n thick (periodic) or span/n thick, so every
    image within ``radius`` lies within ceil(radius n / thickness) bins. Returns -1 for an absurd
    reach (a degenerate cell, or NaN)."""
    thickness = spacing / wp.float64(n)
    if periodic == 0:
        if n == 1:
            return 0  # one bin: nothing beside it
        thickness = (hi - lo) * spacing / wp.float64(n)
    r = wp.ceil(radius / thickness)
    if not (r <= wp.float64(512.0)):
        return -1
    return int(r)


@wp.func
def axis_inverse_width(periodic: int, n: int, lo: wp.float64, hi: wp.float64):
    if periodic != 0:
        return wp.float64(n)
    if n > 1:
        return wp.float64(n) / (hi - lo)
    return wp.float64(1.0)


@wp.func
def axis_bin(f: wp.float64, origin: wp.float64, inv_width: wp.float64, n: int):
    return wp.clamp(int(wp.floor((f - origin) * inv_width)), 0, n - 1)


@wp.func
def wrap_image(c: int, n: int, periodic: int):
    """Bin ``c`` (possibly outside ``[0, n)``) as (bin inside the grid, periodic image), or
    (-1, 0) when it lies off a non-periodic edge."""
    if periodic != 0:
        m = floor_div(c, n)
        return c - m * n, m
    if c < 0 or c >= n:
        return -1, 0
    return c, 0


@wp.struct
class SystemState:
    """Per-system state of the cell list (one row per system)."""

    moved: wp.array(dtype=wp.int32)  # an atom moved beyond skin/2 (set by atoms, read once)
    rebuild: wp.array(dtype=wp.int32)  # this step builds
    builds: wp.array(dtype=wp.int64)  # builds so far
    cell: wp.array(dtype=wp.mat33d)  # the cell of the last build
    pbc: wp.array(dtype=wp.vec3i)  # the periodicity of the last build
    basis_inv: wp.array(dtype=wp.mat33d)  # inverse of the binning basis
    spacing: wp.array(dtype=wp.vec3d)  # plane spacing of each basis axis
    lower: wp.array2d(dtype=wp.float64)  # bounding box (fractional) of non-periodic axes
    upper: wp.array2d(dtype=wp.float64)
    bin_capacity: wp.array(dtype=wp.int32)  # bins this system may use
    bin_start: wp.array(dtype=wp.int32)  # its first bin
    dims: wp.array(dtype=wp.vec3i)  # bins per axis
    reach: wp.array(dtype=wp.vec3i)  # bins searched either side
    origin: wp.array(dtype=wp.vec3d)  # fractional coordinate of bin 0's edge
    inv_width: wp.array(dtype=wp.vec3d)  # bins per unit fractional coordinate
    bad_cell: wp.array(dtype=wp.int32)  # a degenerate periodic cell was seen
    most_neighbors: wp.array(dtype=wp.int32)  # most neighbours of one atom at a build
    shift_out_of_range: wp.array(dtype=wp.int32)  # an image shift beyond +-511 cells


@wp.struct
class AtomState:
    """Per-atom state of the cell list, and the bins (one row per atom or per bin)."""

    system: wp.array(dtype=wp.int32)
    reference: wp.array(dtype=wp.vec3d)  # position at the last build
    fractional: wp.array(dtype=wp.vec3d)  # wrapped fractional coordinates (build only)
    wrap: wp.array(dtype=wp.vec3i)  # lattice vectors removed by wrapping
    bin: wp.array(dtype=wp.vec3i)  # bin coordinates
    slot: wp.array(dtype=wp.int32)  # place within the bin
    sorted: wp.array(dtype=wp.int32)  # atoms in bin order
    bin_count: wp.array(dtype=wp.int32)
    bin_end: wp.array(dtype=wp.int32)  # inclusive cumulative sum of bin_count


@wp.kernel
def mark_moved(positions: wp.array(dtype=Any), g: SystemState, a: AtomState, half_skin_sq: wp.float64):
    i = wp.tid()
    d = vec3d_of(positions[i]) - a.reference[i]
    if wp.dot(d, d) > half_skin_sq:
        g.moved[a.system[i]] = 1


@wp.kernel
def begin_build(cell: wp.array(dtype=Any), pbc: wp.array2d(dtype=wp.bool), g: SystemState):
    s = wp.tid()
    m = mat33d_of(cell[s])
    pa = flag_of(pbc[s, 0])
    pb = flag_of(pbc[s, 1])
    pc = flag_of(pbc[s, 2])
    ref = g.pbc[s]
    old = g.cell[s]
    flag = g.moved[s]
    g.moved[s] = 0
    if pa != ref[0] or pb != ref[1] or pc != ref[2]:
        flag = 1
    # A change of a periodic row changes distances without moving any atom.
    if (pa != 0 and row_changed(m, old, 0)) or (pb != 0 and row_changed(m, old, 1)) or (pc != 0 and row_changed(m, old, 2)):
        flag = 1
    g.rebuild[s] = flag
    if flag == 0:
        return
    g.builds[s] = g.builds[s] + wp.int64(1)
    g.cell[s] = m
    g.pbc[s] = wp.vec3i(pa, pb, pc)
    basis = binning_basis(m, pa, pb, pc)
    det = wp.determinant(basis)
    scale = wp.length(basis[0]) * wp.length(basis[1]) * wp.length(basis[2])
    if not (wp.abs(det) > wp.float64(1.0e-10) * scale):
        # No volume (or NaN): search nothing and report it from verify().
        g.bad_cell[s] = 1
        basis = wp.identity(n=3, dtype=wp.float64)
    inv = wp.inverse(basis)
    g.basis_inv[s] = inv
    # Distance between lattice planes of axis a: 1 / |column a of the inverse|.
    g.spacing[s] = wp.vec3d(
        wp.float64(1.0) / wp.length(wp.vec3d(inv[0, 0], inv[1, 0], inv[2, 0])),
        wp.float64(1.0) / wp.length(wp.vec3d(inv[0, 1], inv[1, 1], inv[2, 1])),
        wp.float64(1.0) / wp.length(wp.vec3d(inv[0, 2], inv[1, 2], inv[2, 2])),
    )
    for k in range(3):
        g.lower[s, k] = wp.float64(1.0e300)
        g.upper[s, k] = wp.float64(-1.0e300)


@wp.func
def wrapped(f: wp.float64, periodic: int):
    if periodic != 0:
        return f - wp.floor(f), int(wp.floor(f))
    return f, 0


@wp.kernel
def fractional_coordinates(positions: wp.array(dtype=Any), g: SystemState, a: AtomState):
    i = wp.tid()
    s = a.system[i]
    if g.rebuild[s] == 0:
        return
    f = vec3d_of(positions[i]) * g.basis_inv[s]
    p = g.pbc[s]
    fx, wx = wrapped(f[0], p[0])
    fy, wy = wrapped(f[1], p[1])
    fz, wz = wrapped(f[2], p[2])
    a.fractional[i] = wp.vec3d(fx, fy, fz)
    a.wrap[i] = wp.vec3i(wx, wy, wz)
    for k in range(3):
        if p[k] == 0:
            wp.atomic_min(g.lower, s, k, f[k])
            wp.atomic_max(g.upper, s, k, f[k])


@wp.kernel
def grid_layout(g: SystemState, radius: wp.float64):
    s = wp.tid()
    if g.rebuild[s] == 0:
        return
    p = g.pbc[s]
    h = g.spacing[s]
    cap = g.bin_capacity[s]
    lo = wp.vec3d(g.lower[s, 0], g.lower[s, 1], g.lower[s, 2])
    hi = wp.vec3d(g.upper[s, 0], g.upper[s, 1], g.upper[s, 2])
    nx = axis_bins(p[0], h[0], lo[0], hi[0], radius, wp.float64(cap))
    ny = axis_bins(p[1], h[1], lo[1], hi[1], radius, wp.float64(cap))
    nz = axis_bins(p[2], h[2], lo[2], hi[2], radius, wp.float64(cap))
    # At most the system's share of bin storage: halve the finest axis until it fits.
    while nx * ny * nz > cap:
        if nx >= ny and nx >= nz:
            nx = wp.max(1, nx / 2)
        elif ny >= nz:
            ny = wp.max(1, ny / 2)
        else:
            nz = wp.max(1, nz / 2)
    kx = axis_reach(p[0], nx, h[0], lo[0], hi[0], radius)
    ky = axis_reach(p[1], ny, h[1], lo[1], hi[1], radius)
    kz = axis_reach(p[2], nz, h[2], lo[2], hi[2], radius)
    if kx < 0 or ky < 0 or kz < 0:
        g.bad_cell[s] = 1
        kx = wp.max(kx, 0)
        ky = wp.max(ky, 0)
        kz = wp.max(kz, 0)
    g.dims[s] = wp.vec3i(nx, ny, nz)
    g.reach[s] = wp.vec3i(kx, ky, kz)
    g.origin[s] = wp.vec3d(
        lo[0] * wp.float64(1 - p[0]), lo[1] * wp.float64(1 - p[1]), lo[2] * wp.float64(1 - p[2])
    )
    g.inv_width[s] = wp.vec3d(
        axis_inverse_width(p[0], nx, lo[0], hi[0]),
        axis_inverse_width(p[1], ny, lo[1], hi[1]),
        axis_inverse_width(p[2], nz, lo[2], hi[2]),
    )


@wp.func
def owns_pair(i: int, j: int, mx: int, my: int, mz: int):
    """Whether atom i lists the pair in a half list: of (i, j) and (j, i) exactly one does, the
    lower index when i + j is odd and the higher when it is even, so rows come out about equally
    long; of i's own images (shift = bin image m) those with a positive shift."""
    if i == j:
        return mx > 0 or (mx == 0 and (my > 0 or (my == 0 and mz > 0)))
    if (i + j) % 2 == 1:
        return i < j
    return i > j


@wp.func
def linear_bin(start: int, n: wp.vec3i, cx: int, cy: int, cz: int):
    return start + (cx * n[1] + cy) * n[2] + cz


@wp.kernel
def count_into_bins(g: SystemState, a: AtomState):
    i = wp.tid()
    s = a.system[i]
    if g.rebuild[s] == 0:
        return
    f = a.fractional[i]
    n = g.dims[s]
    o = g.origin[s]
    w = g.inv_width[s]
    cx = axis_bin(f[0], o[0], w[0], n[0])
    cy = axis_bin(f[1], o[1], w[1], n[1])
    cz = axis_bin(f[2], o[2], w[2], n[2])
    a.bin[i] = wp.vec3i(cx, cy, cz)
    a.slot[i] = wp.atomic_add(a.bin_count, linear_bin(g.bin_start[s], n, cx, cy, cz), 1)


@wp.kernel
def sort_into_bins(g: SystemState, a: AtomState):
    i = wp.tid()
    s = a.system[i]
    if g.rebuild[s] == 0:
        return
    c = a.bin[i]
    b = linear_bin(g.bin_start[s], g.dims[s], c[0], c[1], c[2])
    first = int(0)
    if b > 0:
        first = a.bin_end[b - 1]
    a.sorted[first + a.slot[i]] = i
    # The counts were consumed by the cumulative sum: leave them zero for the next build.
    a.bin_count[b] = 0


@wp.kernel
def search_neighbors(
    positions: wp.array(dtype=Any),
    g: SystemState,
    a: AtomState,
    radius_sq: wp.float64,
    neighbor_index: wp.array2d(dtype=wp.int32),
    neighbor_shift: wp.array2d(dtype=wp.int32),
    neighbor_count: wp.array(dtype=wp.int32),
    half: int,
):
    i = wp.tid()
    s = a.system[i]
    if g.rebuild[s] == 0:
        return
    xi = vec3d_of(positions[i])
    a.reference[i] = xi
    if g.bad_cell[s] != 0:
        neighbor_count[i] = 0  # no images without a cell; verify() reports it
        return
    columns = neighbor_index.shape[0]
    m = g.cell[s]
    p = g.pbc[s]
    n = g.dims[s]
    k = g.reach[s]
    ci = a.bin[i]
    wi = a.wrap[i]
    start = g.bin_start[s]
    found = int(0)
    for ox in range(-k[0], k[0] + 1):
        bx, mx = wrap_image(ci[0] + ox, n[0], p[0])
        if bx < 0:
            continue
        for oy in range(-k[1], k[1] + 1):
            by, my = wrap_image(ci[1] + oy, n[1], p[1])
            if by < 0:
                continue
            for oz in range(-k[2], k[2] + 1):
                bz, mz = wrap_image(ci[2] + oz, n[2], p[2])
                if bz < 0:
                    continue
                b = linear_bin(start, n, bx, by, bz)
                first = int(0)
                if b > 0:
                    first = a.bin_end[b - 1]
                for q in range(first, a.bin_end[b]):
                    j = a.sorted[q]
                    if j == i and mx == 0 and my == 0 and mz == 0:
                        continue
                    if half != 0 and not owns_pair(i, j, mx, my, mz):
                        continue
                    # The image of j next to i, in unwrapped coordinates.
                    wj = a.wrap[j]
                    sx = mx + wi[0] - wj[0]
                    sy = my + wi[1] - wj[1]
                    sz = mz + wi[2] - wj[2]
                    d = vec3d_of(positions[j]) - xi
                    d = d + wp.float64(sx) * m[0] + wp.float64(sy) * m[1] + wp.float64(sz) * m[2]
                    if wp.dot(d, d) < radius_sq:
                        if wp.max(wp.max(wp.abs(sx), wp.abs(sy)), wp.abs(sz)) > 511:
                            g.shift_out_of_range[s] = 1
                        else:
                            if found < columns:
                                neighbor_index[found, i] = j
                                neighbor_shift[found, i] = encode_shift(sx, sy, sz)
                            found += 1
    neighbor_count[i] = wp.min(found, columns)
    wp.atomic_max(g.most_neighbors, s, found)


# Concrete instances for float32 and float64 positions, declared before any launch so that the
# module compiles once (and before a CUDA graph capture, which cannot load modules).
for _vec, _mat in ((wp.vec3f, wp.mat33f), (wp.vec3d, wp.mat33d)):
    wp.overload(mark_moved, {"positions": wp.array(dtype=_vec)})
    wp.overload(begin_build, {"cell": wp.array(dtype=_mat)})
    wp.overload(fractional_coordinates, {"positions": wp.array(dtype=_vec)})
    wp.overload(search_neighbors, {"positions": wp.array(dtype=_vec)})
