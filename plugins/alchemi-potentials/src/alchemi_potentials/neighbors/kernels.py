"""Warp kernels of the batched cell list (see :mod:`alchemi_potentials.neighbors.cell_list`).

Each system's atoms occupy the *slots* of its own atom range, in bin order after a build. Every
update launches, on every system:

0. ``follow_cell`` (systems): lets a deformed cell's list stand where the skin allows.
1. ``check_moved`` (slots): flags a system whose atom moved past skin/2 (or ``near``: past the
   join fraction of it) and writes the atom's wrapped position, the one the pair kernels read.
2. ``begin_build`` (systems): a flagged system starts a build: binning frame, bins, reach.
3. ``bin_atoms`` (atoms), 4. a ``torch.cumsum`` of the bin counts, 5. ``sort_into_bins`` (atoms).
6. ``search_neighbors`` (slots; :mod:`.search`): each slot's neighbours into its entries.

A system that does not rebuild exits each build kernel at once: nothing is decided on the host.
Build geometry is float64 whatever the positions' precision, so bins never lose an atom.
"""

from __future__ import annotations

from typing import Any

import warp as wp

from alchemi_potentials.neighbors.geometry import (
    HASHED_REACH,
    binning_basis,
    flag_of,
    floor_mod,
    grid_dims,
    hashed_cell,
    mat33d_of,
    periodic_reach,
    periodic_rows,
    plane_spacings,
    row_changed,
    vec3d_of,
)

wp.set_module_options({"enable_backward": False})


@wp.struct
class SystemState:
    """Per-system state of the cell list (one row per system)."""

    moved: wp.array(dtype=wp.int32)  # an atom moved beyond skin/2 (set by atoms, read once)
    near: wp.array(dtype=wp.int32)  # an atom moved beyond the join threshold (see check_moved)
    batch_moved: wp.array(dtype=wp.int32)  # [1]: some system of the batch has ``moved`` this step
    rebuild: wp.array(dtype=wp.int32)  # this step builds: 1, or 2 when the cell is degenerate
    builds: wp.array(dtype=wp.int64)  # builds so far
    cell: wp.array(dtype=wp.mat33d)  # the cell of the last build
    lattice: wp.array(dtype=wp.mat33d)  # its periodic rows (open rows zero): what images shift by
    pbc: wp.array(dtype=wp.vec3i)  # the periodicity of the last build
    basis_inv: wp.array(dtype=wp.mat33d)  # inverse of the binning frame
    dims: wp.array(dtype=wp.vec3i)  # bins per axis
    reach: wp.array(dtype=wp.vec3i)  # bins searched either side
    inv_width: wp.array(dtype=wp.vec3d)  # bins per unit fractional coordinate
    bin_capacity: wp.array(dtype=wp.int32)  # bins this system may use
    bin_start: wp.array(dtype=wp.int32)  # its first bin
    first_atom: wp.array(dtype=wp.int32)  # its first atom (and slot)
    num_atoms: wp.array(dtype=wp.int32)  # its atoms
    work: wp.array(dtype=wp.int32)  # this step: its atoms if it builds, else 0 (a listed search)
    work_end: wp.array(dtype=wp.int32)  # inclusive cumulative sum of work (a listed search)
    index_bits: wp.array(dtype=wp.int32)  # bits of an entry's slot (see entries.py)
    bad_cell: wp.array(dtype=wp.int32)  # a degenerate periodic cell was seen
    overflow: wp.array(dtype=wp.int32)  # most neighbours of an atom that had more than fit
    image_out_of_range: wp.array(dtype=wp.int32)  # an image beyond what an entry holds
    far_atoms: wp.array(dtype=wp.int32)  # an atom absurdly far (or NaN) outside its cell
    deform: wp.array(dtype=wp.mat33d)  # h^-1 h_0: maps positions back to the cell of the last build
    allowed_sq: wp.array(dtype=wp.float64)  # squared displacement (so mapped) an atom may have
    followed: wp.array(dtype=wp.int32)  # 1: the cell changed and the list follows it unrebuilt


@wp.struct
class AtomState:
    """Per-atom and per-slot state of the cell list, and the bins."""

    system: wp.array(dtype=wp.int32)  # system of each atom, which is also the system of each slot
    order: wp.array(dtype=wp.int32)  # slot -> atom
    wrap: wp.array(dtype=wp.vec3i)  # slot: lattice vectors removed by wrapping at the last build
    slot_bin: wp.array(dtype=wp.int32)  # slot: its bin
    slot_number: wp.array(dtype=wp.int32)  # slot: atomic number
    atomic_number: wp.array(dtype=wp.int32)  # atom: atomic number
    atom_bin: wp.array(dtype=wp.int32)  # atom: its bin (during a build)
    atom_place: wp.array(dtype=wp.int32)  # atom: its place within the bin (during a build)
    atom_wrap: wp.array(dtype=wp.vec3i)  # atom: its wrap (during a build)
    bin_count: wp.array(dtype=wp.int32)
    bin_end: wp.array(dtype=wp.int32)  # inclusive cumulative sum of bin_count


@wp.struct
class PairList:
    """What the pair kernels read of a neighbour list (see :class:`NeighborMatrix`)."""

    entries: wp.array2d(dtype=wp.int32)  # [columns, slots] packed neighbours (entries.py)
    count: wp.array(dtype=wp.int32)  # valid entries of each slot
    order: wp.array(dtype=wp.int32)  # slot -> atom
    system: wp.array(dtype=wp.int32)  # system of each slot
    first_atom: wp.array(dtype=wp.int32)  # first slot of each system
    index_bits: wp.array(dtype=wp.int32)  # slot bits of each system's entries
    slot_number: wp.array(dtype=wp.int32)  # atomic number of each slot


@wp.func
def wrapped_position(x: wp.vec3d, w: wp.vec3i, m: wp.mat33d):
    return x - (wp.float64(w[0]) * m[0] + wp.float64(w[1]) * m[1] + wp.float64(w[2]) * m[2])


@wp.func
def store_vec(out: wp.array(dtype=Any), i: int, v: wp.vec3d):
    """``out[i] = v`` in ``out``'s precision."""
    x = out[i]
    out[i] = type(x)(type(x[0])(v[0]), type(x[0])(v[1]), type(x[0])(v[2]))


@wp.func
def store_mat(out: wp.array(dtype=Any), i: int, m: wp.mat33d):
    """``out[i] = m`` in ``out``'s precision."""
    x = out[i]
    out[i] = type(x)(
        type(x[0, 0])(m[0, 0]), type(x[0, 0])(m[0, 1]), type(x[0, 0])(m[0, 2]),
        type(x[0, 0])(m[1, 0]), type(x[0, 0])(m[1, 1]), type(x[0, 0])(m[1, 2]),
        type(x[0, 0])(m[2, 0]), type(x[0, 0])(m[2, 1]), type(x[0, 0])(m[2, 2]),
    )  # fmt: skip


@wp.func
def slot_offset(g: SystemState, a: AtomState, s: int):
    """Slot of cumulative bin position 0 for system s (``bin_end`` counts only rebuilding
    systems' atoms, while a system's slots start at its first atom)."""
    start = g.bin_start[s]
    before = int(0)
    if start > 0:
        before = a.bin_end[start - 1]
    return g.first_atom[s] - before


@wp.kernel
def follow_cell(
    cell: wp.array(dtype=Any),
    pbc: wp.array2d(dtype=wp.bool),
    g: SystemState,
    cutoff: wp.float64,
    skin: wp.float64,
    image_cell: wp.array(dtype=Any),
):
    """Let a fully periodic system's list follow a deformed cell without a rebuild.

    With ``M = h^-1 h_0`` (current cell ``h``, cell of the last build ``h_0``), a pair listed
    beyond ``cutoff + skin`` stays beyond ``cutoff`` while every atom's ``x M`` is within
    ``(skin - cutoff |M - 1|_F) / 2`` of its build position, as ``|M|_2 <= 1 + |M - 1|_F``.
    Otherwise the build is left to :func:`begin_build`.
    """
    s = wp.tid()
    if s == 0:  # the step's first kernel: no system has moved yet (check_moved sets it)
        g.batch_moved[0] = 0
    half = skin * wp.float64(0.5)
    g.deform[s] = wp.identity(n=3, dtype=wp.float64)
    g.allowed_sq[s] = half * half
    g.followed[s] = 0
    m = mat33d_of(cell[s])
    old = g.cell[s]
    pa = flag_of(pbc[s, 0])
    pb = flag_of(pbc[s, 1])
    pc = flag_of(pbc[s, 2])
    ref = g.pbc[s]
    if pa != ref[0] or pb != ref[1] or pc != ref[2] or pa == 0 or pb == 0 or pc == 0:
        return
    if not (row_changed(m, old, 0) or row_changed(m, old, 1) or row_changed(m, old, 2)):
        return
    if not (wp.abs(wp.determinant(m)) > wp.float64(0.0)):
        return
    back = wp.inverse(m) * old
    e = back - wp.identity(n=3, dtype=wp.float64)
    stretch = wp.sqrt(wp.ddot(e, e))
    allowed = (skin - cutoff * stretch) * wp.float64(0.5)
    if not (allowed > wp.float64(0.0)):  # NaN too (the first build)
        return
    g.deform[s] = back
    g.allowed_sq[s] = allowed * allowed
    g.followed[s] = 1
    lattice = periodic_rows(m, wp.vec3i(pa, pb, pc))
    g.lattice[s] = lattice
    store_mat(image_cell, s, lattice)


@wp.kernel
def check_moved(
    positions: wp.array(dtype=Any),
    reference: wp.array(dtype=Any),
    wrapped: wp.array(dtype=Any),
    g: SystemState,
    a: AtomState,
    join_sq: wp.float64,
):
    # join_sq: join_fraction squared, the share of allowed_sq past which an atom's system is near.
    t = wp.tid()
    s = a.system[t]
    x = vec3d_of(positions[a.order[t]])
    d = x * g.deform[s] - vec3d_of(reference[t])
    dd = wp.dot(d, d)
    if not (dd <= join_sq * g.allowed_sq[s]):  # NaN too: the build reports it
        # Read before writing: most threads then leave the flag's line alone.
        if g.near[s] == 0:
            g.near[s] = 1
        if not (dd <= g.allowed_sq[s]):
            if g.moved[s] == 0:
                g.moved[s] = 1
            if g.batch_moved[0] == 0:
                g.batch_moved[0] = 1
    store_vec(wrapped, t, wrapped_position(x, a.wrap[t], g.lattice[s]))


@wp.kernel
def begin_build(
    cell: wp.array(dtype=Any),
    pbc: wp.array2d(dtype=wp.bool),
    g: SystemState,
    radius: wp.float64,
    tolerance: wp.float64,
    image_cell: wp.array(dtype=Any),
):
    s = wp.tid()
    m = mat33d_of(cell[s])
    pa = flag_of(pbc[s, 0])
    pb = flag_of(pbc[s, 1])
    pc = flag_of(pbc[s, 2])
    ref = g.pbc[s]
    old = g.cell[s]
    flag = g.moved[s]
    g.moved[s] = 0
    # Rebuilds in cohorts (BatchedNeighborList's join_fraction).
    if g.near[s] != 0 and g.batch_moved[0] != 0:
        flag = 1
    g.near[s] = 0
    if pa != ref[0] or pb != ref[1] or pc != ref[2]:
        flag = 1
    # A change of a periodic row changes distances without moving any atom.
    changed = (pa != 0 and row_changed(m, old, 0)) or (pb != 0 and row_changed(m, old, 1))
    changed = changed or (pc != 0 and row_changed(m, old, 2))
    if changed and g.followed[s] == 0:  # a change follow_cell did not absorb
        flag = 1
    g.rebuild[s] = flag
    if flag == 0:
        g.work[s] = 0
        return
    g.work[s] = g.num_atoms[s]
    g.builds[s] = g.builds[s] + wp.int64(1)
    g.cell[s] = m
    p = wp.vec3i(pa, pb, pc)
    g.pbc[s] = p
    lattice = periodic_rows(m, p)
    g.lattice[s] = lattice
    store_mat(image_cell, s, lattice)
    basis = binning_basis(m, pa, pb, pc)
    det = wp.determinant(basis)
    scale = wp.length(basis[0]) * wp.length(basis[1]) * wp.length(basis[2])
    bad = 0
    if not (wp.abs(det) > tolerance * scale):
        # No volume (or NaN): search nothing and report it from verify().
        bad = 1
        basis = wp.identity(n=3, dtype=wp.float64)
    inv = wp.inverse(basis)
    g.basis_inv[s] = inv
    h = plane_spacings(inv)
    n = grid_dims(p, h, radius, g.bin_capacity[s])
    k = wp.vec3i(HASHED_REACH, HASHED_REACH, HASHED_REACH)
    w = wp.vec3d(wp.float64(2.0) / radius, wp.float64(2.0) / radius, wp.float64(2.0) / radius)
    for ax in range(3):
        if p[ax] != 0:
            k[ax] = periodic_reach(n[ax], h[ax], radius)
            w[ax] = wp.float64(n[ax])
            if k[ax] < 0:
                bad = 1
                k[ax] = 0
    if bad != 0:
        g.bad_cell[s] = 1  # kept for verify(); this build lists nothing
        g.rebuild[s] = 2
    g.dims[s] = n
    g.reach[s] = k
    g.inv_width[s] = w


@wp.kernel
def bin_atoms(positions: wp.array(dtype=Any), g: SystemState, a: AtomState):
    i = wp.tid()
    s = a.system[i]
    if g.rebuild[s] == 0:
        return
    f = vec3d_of(positions[i]) * g.basis_inv[s]
    p = g.pbc[s]
    n = g.dims[s]
    w = g.inv_width[s]
    c = wp.vec3i(0, 0, 0)
    wrap = wp.vec3i(0, 0, 0)
    for ax in range(3):
        if p[ax] != 0:
            whole = wp.floor(f[ax])
            if not (wp.abs(whole) <= wp.float64(1048576.0)):
                g.far_atoms[s] = 1  # over a million cells out, or NaN: reported by verify()
                whole = wp.float64(0.0)
            wrap[ax] = int(whole)
            c[ax] = wp.clamp(int(wp.floor((f[ax] - whole) * w[ax])), 0, n[ax] - 1)
        else:
            c[ax] = floor_mod(hashed_cell(f[ax], w[ax]), n[ax])
    b = g.bin_start[s] + (c[0] * n[1] + c[1]) * n[2] + c[2]
    a.atom_wrap[i] = wrap
    a.atom_bin[i] = b
    a.atom_place[i] = wp.atomic_add(a.bin_count, b, 1)


@wp.kernel
def sort_into_bins(
    positions: wp.array(dtype=Any),
    reference: wp.array(dtype=Any),
    wrapped: wp.array(dtype=Any),
    g: SystemState,
    a: AtomState,
):
    i = wp.tid()
    s = a.system[i]
    if g.rebuild[s] == 0:
        return
    b = a.atom_bin[i]
    first = int(0)
    if b > 0:
        first = a.bin_end[b - 1]
    t = first + a.atom_place[i] + slot_offset(g, a, s)
    wrap = a.atom_wrap[i]
    x = positions[i]
    a.order[t] = i
    a.wrap[t] = wrap
    a.slot_bin[t] = b
    a.slot_number[t] = a.atomic_number[i]
    reference[t] = x
    store_vec(wrapped, t, wrapped_position(vec3d_of(x), wrap, g.lattice[s]))
    # The counts were consumed by the cumulative sum: leave them zero for the next build.
    a.bin_count[b] = 0


@wp.func
def owns_pair(t: int, u: int, mx: int, my: int, mz: int):
    """Whether slot t lists the pair in a half list: the lower slot when t + u is odd, the higher
    when even (rows about equally long); of t's own images the positive ones."""
    if t == u:
        return mx > 0 or (mx == 0 and (my > 0 or (my == 0 and mz > 0)))
    if (t + u) % 2 == 1:
        return t < u
    return t > u


@wp.kernel
def list_work(g: SystemState, a: AtomState, work_slot: wp.array(dtype=wp.int32)):
    """The slots of the systems that rebuild, in slot order: ``work_slot[r]`` is the r-th."""
    t = wp.tid()
    s = a.system[t]
    n = g.work[s]
    if n != 0:
        work_slot[g.work_end[s] - n + t - g.first_atom[s]] = t


# float32 and float64 instances, declared before any launch so that the module compiles once.
for _vec, _mat in ((wp.vec3f, wp.mat33f), (wp.vec3d, wp.mat33d)):
    _arr = wp.array(dtype=_vec)
    wp.overload(follow_cell, {"cell": wp.array(dtype=_mat), "image_cell": wp.array(dtype=_mat)})
    wp.overload(check_moved, {"positions": _arr, "reference": _arr, "wrapped": _arr})
    wp.overload(begin_build, {"cell": wp.array(dtype=_mat), "image_cell": wp.array(dtype=_mat)})
    wp.overload(bin_atoms, {"positions": _arr})
    wp.overload(sort_into_bins, {"positions": _arr, "reference": _arr, "wrapped": _arr})
