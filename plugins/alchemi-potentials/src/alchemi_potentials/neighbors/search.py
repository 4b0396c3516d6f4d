"""The neighbour search kernel (step 6 of :mod:`.kernels`): each rebuilding slot's neighbours
from the bins around its own, over periodic images, into its row of packed entries.

Two variants (:func:`search_kernel`) give the same entries in the same order: the whole box, bin
by bin (the GPU's), and trimmed (``PotentialsTuning.search_trim``, a CPU's): bins wholly beyond
the radius are skipped (:func:`bin_gap` bounds the distance to a bin), and the bins of a column
that share an image are walked as one run of slots.

Example:
    >>> search_kernel(False) is search_neighbors
    True
"""

from __future__ import annotations

import functools
from typing import Any

import warp as wp

from alchemi_potentials.neighbors.entries import encode_entry, image_bits_for, image_limit
from alchemi_potentials.neighbors.geometry import neighbor_bin, plane_spacings, search_span, vec3d_of
from alchemi_potentials.neighbors.kernels import AtomState, SystemState, owns_pair, slot_offset

wp.set_module_options({"enable_backward": False})


@wp.func
def bin_gap(o: int, phi: wp.float64, thickness: wp.float64):
    """Distance (Å) across the bin planes between an atom at ``phi`` (bin units from its bin's
    lower plane) and the bin ``o`` bins away along one axis (0 for its own bin)."""
    gap = wp.float64(0.0)
    if o > 0:
        gap = (wp.float64(o) - phi) * thickness
    elif o < 0:
        gap = (phi - wp.float64(o) - wp.float64(1.0)) * thickness
    return wp.max(gap, wp.float64(0.0))


@wp.func
def trim_frame(y: wp.vec3d, g: SystemState, s: int, home: wp.vec3i, spans: wp.vec3i):
    """Where slot t's atom sits in its bin (``phi``, bin units), each axis's bin thickness (Å; 0
    where bins cannot be trimmed) and whether the binning frame is orthogonal."""
    inv = g.basis_inv[s]
    w = g.inv_width[s]
    k = g.reach[s]
    p = g.pbc[s]
    f = y * inv
    phi = wp.vec3d()
    thickness = wp.vec3d()
    spacing = plane_spacings(inv)
    for ax in range(3):
        u = f[ax] * w[ax]
        base = wp.float64(home[ax])
        if p[ax] == 0:
            base = wp.floor(u)
        phi[ax] = u - base
        if spans[ax] == 2 * k[ax] + 1 and phi[ax] >= wp.float64(-0.5) and phi[ax] <= wp.float64(1.5):
            thickness[ax] = spacing[ax] / w[ax]
    c0 = wp.vec3d(inv[0, 0], inv[1, 0], inv[2, 0])
    c1 = wp.vec3d(inv[0, 1], inv[1, 1], inv[2, 1])
    c2 = wp.vec3d(inv[0, 2], inv[1, 2], inv[2, 2])
    tol = wp.float64(1.0) / wp.float64(1073741824.0)  # 2^-30 (Warp 1.5 keeps literals in float32)
    ortho = int(0)
    if (wp.abs(wp.dot(c0, c1)) <= tol * wp.length(c0) * wp.length(c1)
            and wp.abs(wp.dot(c0, c2)) <= tol * wp.length(c0) * wp.length(c2)
            and wp.abs(wp.dot(c1, c2)) <= tol * wp.length(c1) * wp.length(c2)):
        ortho = 1
    return phi, thickness, ortho


@wp.func
def column_count(g: SystemState, s: int):
    """Bin columns (qx, qy) of system s's search box."""
    return search_span(g.reach[s][0], g.dims[s][0], g.pbc[s][0]) * search_span(g.reach[s][1], g.dims[s][1], g.pbc[s][1])


@wp.func
def finish_row(g: SystemState, count: wp.array(dtype=wp.int32), t: int, s: int, found: int, columns: int):
    count[t] = wp.min(found, columns)
    if found > columns:
        # A plain max on a CPU: always set, though possibly with another thread's smaller count.
        wp.atomic_max(g.overflow, s, found)


@wp.func
def part_range(g: SystemState, s: int, j: int, parts: int):
    """Part j of ``parts`` of system s's bin columns: [lo, hi), in the order of a whole search."""
    total = column_count(g, s)
    each = (total + parts - 1) / parts
    lo = wp.min(j * each, total)
    return lo, wp.min(lo + each, total)


@wp.func
def scan_slots(
    wrapped: wp.array(dtype=Any),
    g: SystemState,
    radius_sq: wp.float64,
    entries: wp.array2d(dtype=wp.int32),
    half: int,
    t: int,
    s: int,
    yi: wp.vec3d,
    image: wp.vec3d,
    mx: int,
    my: int,
    mz: int,
    lo: int,
    hi: int,
    first_slot: int,
    bits: int,
    limit: int,
    write_at: int,
    write: int,
    found: int,
):
    """``found`` plus slot t's neighbours among slots ``[lo, hi)`` at image ``(mx, my, mz)``."""
    columns = entries.shape[0]
    ibits = image_bits_for(bits)
    for u in range(lo, hi):
        if u == t and mx == 0 and my == 0 and mz == 0:
            continue
        if half != 0 and not owns_pair(t, u, mx, my, mz):
            continue
        d = vec3d_of(wrapped[u]) - yi + image
        if wp.dot(d, d) < radius_sq:
            if wp.max(wp.max(wp.abs(mx), wp.abs(my)), wp.abs(mz)) > limit:
                g.image_out_of_range[s] = 1
            else:
                if write != 0 and write_at + found < columns:
                    entries[write_at + found, t] = encode_entry(u - first_slot, mx, my, mz, bits, ibits)
                found += 1
    return found


@functools.cache
def search_kernel(trim: bool) -> Any:
    """The search kernel, trimmed (in runs) or over the whole box bin by bin, with float32 and
    float64 instances."""
    TRIM = trim

    def scan_columns(
        wrapped: wp.array(dtype=Any),
        g: SystemState,
        a: AtomState,
        radius_sq: wp.float64,
        entries: wp.array2d(dtype=wp.int32),
        half: int,
        t: int,
        s: int,
        first: int,
        last: int,
        write_at: int,
        write: int,
    ):
        """Slot t's neighbours in the bin columns ``[first, last)`` of its search box, written (with
        ``write``) to ``entries`` from column ``write_at`` on; returns how many there are."""
        yi = vec3d_of(wrapped[t])
        m = g.lattice[s]
        p = g.pbc[s]
        n = g.dims[s]
        k = g.reach[s]
        start = g.bin_start[s]
        first_slot = g.first_atom[s]
        bits = g.index_bits[s]
        limit = image_limit(image_bits_for(bits))
        local = a.slot_bin[t] - start
        offset = slot_offset(g, a, s)
        cz = local % n[2]
        cy = (local / n[2]) % n[1]
        cx = local / (n[1] * n[2])
        span_y = search_span(k[1], n[1], p[1])
        span_z = search_span(k[2], n[2], p[2])
        found = int(0)
        if wp.static(TRIM):
            radius = wp.sqrt(radius_sq)
            # Slack for rounding (a float32 position may lie a hair outside its bin): 2^-17 of the
            # lengths involved, and 2^-20 Å.
            reach_all = radius + wp.length(m[0]) + wp.length(m[1]) + wp.length(m[2])
            slack = (reach_all / wp.float64(131072.0)) + wp.float64(1.0) / wp.float64(1048576.0)
            spans = wp.vec3i(search_span(k[0], n[0], p[0]), span_y, span_z)
            phi, thick, ortho = trim_frame(yi, g, s, wp.vec3i(cx, cy, cz), spans)
        for f in range(first, last):
            ox = f / span_y - k[0]
            oy = f % span_y - k[1]
            if wp.static(TRIM):
                z_first = int(0)
                z_last = span_z
                gx = wp.max(bin_gap(ox, phi[0], thick[0]) - slack, wp.float64(0.0))
                gy = wp.max(bin_gap(oy, phi[1], thick[1]) - slack, wp.float64(0.0))
                # Orthogonal bins: the gaps add as squares; otherwise each alone bounds the distance.
                left = radius_sq - gx * gx - gy * gy
                if ortho == 0:
                    left = radius_sq - wp.max(gx, gy) * wp.max(gx, gy)
                if left <= wp.float64(0.0):
                    continue
                if thick[2] > wp.float64(0.0):
                    reach = radius
                    if ortho != 0:
                        reach = wp.sqrt(left)
                    reach_z = (reach + slack) / thick[2]  # bin units
                    # bins with gap < reach_z: offsets in (phi - 1 - reach_z, phi + reach_z)
                    z_first = wp.max(z_first, int(wp.floor(phi[2] - wp.float64(1.0) - reach_z)) + 1 + k[2])
                    z_last = wp.min(z_last, int(wp.ceil(phi[2] + reach_z)) + k[2])
            bx, mx = neighbor_bin(cx, ox, n[0], p[0])
            by, my = neighbor_bin(cy, oy, n[1], p[1])
            if wp.static(TRIM):
                # The bins from qz to the grid's end share one image: one run of slots.
                qz = z_first
                while qz < z_last:
                    bz, mz = neighbor_bin(cz, qz - k[2], n[2], p[2])
                    length = wp.min(z_last - qz, n[2] - bz)
                    b = start + (bx * n[1] + by) * n[2] + bz
                    lo = int(0)
                    if b > 0:
                        lo = a.bin_end[b - 1]
                    image = wp.float64(mx) * m[0] + wp.float64(my) * m[1] + wp.float64(mz) * m[2]
                    found = scan_slots(wrapped, g, radius_sq, entries, half, t, s, yi, image, mx, my, mz,
                                       lo + offset, a.bin_end[b + length - 1] + offset, first_slot, bits, limit,
                                       write_at, write, found)
                    qz += length
            else:
                for qz in range(span_z):
                    bz, mz = neighbor_bin(cz, qz - k[2], n[2], p[2])
                    b = start + (bx * n[1] + by) * n[2] + bz
                    lo = int(0)
                    if b > 0:
                        lo = a.bin_end[b - 1]
                    image = wp.float64(mx) * m[0] + wp.float64(my) * m[1] + wp.float64(mz) * m[2]
                    found = scan_slots(wrapped, g, radius_sq, entries, half, t, s, yi, image, mx, my, mz,
                                       lo + offset, a.bin_end[b] + offset, first_slot, bits, limit, write_at,
                                       write, found)
        return found


    def search_slot(
        wrapped: wp.array(dtype=Any),
        g: SystemState,
        a: AtomState,
        radius_sq: wp.float64,
        entries: wp.array2d(dtype=wp.int32),
        count: wp.array(dtype=wp.int32),
        found_in_part: wp.array2d(dtype=wp.int16),
        half: int,
        write: int,
        t: int,
        j: int,
    ):
        """Part j of slot t's search (see :func:`search_neighbors`), if its system rebuilds."""
        parts = found_in_part.shape[0]
        s = a.system[t]
        rebuild = g.rebuild[s]
        if rebuild == 2:
            if write != 0 and j == 0:
                count[t] = 0  # no images without a cell; verify() reports it
        elif rebuild != 0:
            lo, hi = part_range(g, s, j, parts)
            if write == 0:
                found = scan_columns(wrapped, g, a, radius_sq, entries, half, t, s, lo, hi, 0, 0)
                # Clamped to int16 (2 bytes per slot and part): a count this large overflows the row anyway.
                found_in_part[j, t] = wp.int16(wp.min(found, 32767))
            else:
                before = int(0)
                for q in range(j):
                    before += int(found_in_part[q, t])
                found = scan_columns(wrapped, g, a, radius_sq, entries, half, t, s, lo, hi, before, 1)
                if j == parts - 1:
                    finish_row(g, count, t, s, before + found, entries.shape[0])


    def search_neighbors(
        wrapped: wp.array(dtype=Any),
        g: SystemState,
        a: AtomState,
        radius_sq: wp.float64,
        entries: wp.array2d(dtype=wp.int32),
        count: wp.array(dtype=wp.int32),
        found_in_part: wp.array2d(dtype=wp.int16),
        half: int,
        write: int,
        slots: int,
        work_slot: wp.array(dtype=wp.int32),
        last_system: int,
        threads: int,
    ):
        """Each slot's neighbours, by ``parts = found_in_part.shape[0]`` threads per slot (thread
        ``j * slots + t`` is part j of slot t). In parts it runs twice: ``write`` 0 counts each
        part's neighbours, ``write`` 1 writes them after those of the parts before; the last part
        sets the slot's count. With ``threads`` > 0 the threads stride over (part, listed slot)
        pairs of the rebuilding slots in ``work_slot`` (:func:`list_work`).
        """
        tid = wp.tid()
        if threads == 0:
            search_slot(wrapped, g, a, radius_sq, entries, count, found_in_part, half, write, tid % slots, tid / slots)
        else:
            total = g.work_end[last_system]
            w = tid
            while w < found_in_part.shape[0] * total:
                search_slot(wrapped, g, a, radius_sq, entries, count, found_in_part, half, write,
                            work_slot[w % total], w / total)
                w += threads



    # Each variant in a Warp module of its own (Warp groups functions by their Python module).
    for func in (scan_columns, search_slot, search_neighbors):
        func.__module__ = f"{__name__}.{'trimmed' if TRIM else 'whole'}"
    scan_columns = wp.func(scan_columns)  # found through the closures at code generation
    search_slot = wp.func(search_slot)
    kernel = wp.kernel(search_neighbors, enable_backward=False)
    for vec in (wp.vec3f, wp.vec3d):
        wp.overload(kernel, {"wrapped": wp.array(dtype=vec)})
    return kernel


#: The GPU's search (every bin of the box); see :func:`search_kernel`.
search_neighbors = search_kernel(False)
