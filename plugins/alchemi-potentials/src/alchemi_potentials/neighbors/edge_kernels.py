"""Warp kernels that turn the neighbour matrix into COO edges (see :mod:`.edges`):
``count_edges`` counts each slot's listed neighbours within the cutoff, a ``torch.cumsum`` gives
offsets, ``write_edges`` writes them and ``pad_edges`` fills the rest. Distances are float64 from
the current positions and cell: ``d = positions[j] - positions[i] + S @ cell``.
"""

from __future__ import annotations

from typing import Any

import warp as wp

from alchemi_potentials.neighbors.entries import entry_image, entry_slot, image_bits_for
from alchemi_potentials.neighbors.kernels import PairList

wp.set_module_options({"enable_backward": False})


@wp.func
def _shift_of(pl: PairList, wrap: wp.array(dtype=wp.vec3i), t: int, code: int):
    """Neighbour atom and ASE lattice shift of entry ``code`` of slot ``t``."""
    s = pl.system[t]
    bits = pl.index_bits[s]
    u = pl.first_atom[s] + entry_slot(code, bits)
    m = entry_image(code, bits, image_bits_for(bits))
    return u, m + wrap[t] - wrap[u]


@wp.func
def _distance_sq(positions: wp.array(dtype=Any), cell: wp.array(dtype=Any), s: int, i: int, j: int,
                 shift: wp.vec3i):
    xi = positions[i]
    xj = positions[j]
    c = cell[s]
    d = wp.vec3d(wp.float64(xj[0] - xi[0]), wp.float64(xj[1] - xi[1]), wp.float64(xj[2] - xi[2]))
    for a in range(3):
        f = wp.float64(shift[a])
        d = d + wp.vec3d(f * wp.float64(c[a, 0]), f * wp.float64(c[a, 1]), f * wp.float64(c[a, 2]))
    return wp.dot(d, d)


@wp.kernel
def count_edges(pl: PairList, wrap: wp.array(dtype=wp.vec3i), positions: wp.array(dtype=Any),
                cell: wp.array(dtype=Any), cutoff_sq: wp.float64, per_slot: wp.array(dtype=wp.int32)):
    t = wp.tid()
    i = pl.order[t]
    s = pl.system[t]
    n = int(0)  # noqa: UP018 - Warp needs a dynamic variable to count in a loop
    for k in range(pl.count[t]):
        u, shift = _shift_of(pl, wrap, t, pl.entries[k, t])
        if _distance_sq(positions, cell, s, i, pl.order[u], shift) < cutoff_sq:
            n += 1
    per_slot[t] = n


@wp.kernel
def write_edges(pl: PairList, wrap: wp.array(dtype=wp.vec3i), positions: wp.array(dtype=Any),
                cell: wp.array(dtype=Any), cutoff_sq: wp.float64, ends: wp.array(dtype=wp.int32),
                per_slot: wp.array(dtype=wp.int32), capacity: int, sender: wp.array(dtype=wp.int64),
                receiver: wp.array(dtype=wp.int64), shifts: wp.array(dtype=Any), edge_system: wp.array(dtype=wp.int64),
                padding: wp.array(dtype=Any), overflow: wp.array(dtype=wp.int32)):
    t = wp.tid()
    i = pl.order[t]
    s = pl.system[t]
    e = ends[t] - per_slot[t]
    if ends[t] > capacity:
        wp.atomic_max(overflow, 0, ends[t])
    for k in range(pl.count[t]):
        u, shift = _shift_of(pl, wrap, t, pl.entries[k, t])
        j = pl.order[u]
        if _distance_sq(positions, cell, s, i, j, shift) < cutoff_sq:
            if e < capacity:
                sender[e] = wp.int64(i)
                receiver[e] = wp.int64(j)
                v = shifts[e]
                shifts[e] = type(v)(type(v[0])(shift[0]), type(v[0])(shift[1]), type(v[0])(shift[2]))
                edge_system[e] = wp.int64(s)
                p = padding[e]
                padding[e] = type(p)(type(p[0])(0), type(p[0])(0), type(p[0])(0))
            e += 1


@wp.kernel
def pad_edges(ends: wp.array(dtype=wp.int32), last: int, atom_system: wp.array(dtype=wp.int64), length: Any,
              sender: wp.array(dtype=wp.int64), receiver: wp.array(dtype=wp.int64), shifts: wp.array(dtype=Any),
              edge_system: wp.array(dtype=wp.int64), padding: wp.array(dtype=Any)):
    """Edges past the last real one: an atom to itself with displacement ``(length, 0, 0)``; the
    atoms take turns, so that no atom's row takes every padding edge's scatter."""
    e = wp.tid()
    if e < ends[last]:
        return
    a = e % atom_system.shape[0]
    sender[e] = wp.int64(a)
    receiver[e] = wp.int64(a)
    v = shifts[e]
    zero = type(v[0])(0)
    shifts[e] = type(v)(zero, zero, zero)
    edge_system[e] = atom_system[a]
    padding[e] = type(v)(length, zero, zero)
