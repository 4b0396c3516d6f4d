"""Warp kernels of the nudged elastic band force (:mod:`alchemi_integrators.neb`).

A band is a chain of systems (images): ``prev[b]`` and ``next[b]`` are the systems before and
after image ``b`` (-1 at the band's ends), and atom ``j`` of an image corresponds to atom ``j`` of
its neighbours. Four launches, no host synchronisation:

1. per system: the tangent's weights (the improved tangent of Henkelman and Jónsson, J. Chem.
   Phys. 113, 9978 (2000), eqs. 8-11) and the image's role: end point, image or climbing image
   (the highest interior image, where ``climb``, from the start or, with ``climb_fmax`` > 0, once
   the band's largest force of the step before is below it);
2. per atom: the neighbour differences ``t1 = x - x_prev``, ``t2 = x_next - x`` (minimum image
   on periodic axes), the unnormalised tangent and its per-system sums (``tau.tau``, ``F.tau``,
   ``|t1|^2``, ``|t2|^2``);
3. per atom: the NEB force, ``F - (F.tau) tau + k (|t2| - |t1|) tau`` (eq. 12), or
   ``F - 2 (F.tau) tau`` on the climbing image; on the end points 0, or ``F`` where they relax
   with the band (``relax_endpoints``); each system's largest atom force;
4. per system: the band's largest force over its images (what decides its convergence).

Systems that are not ``active`` (other stages, finished bands) keep their forces.

Example:
    >>> from alchemi_integrators import neb_kernels  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import warp as wp

from alchemi_integrators.kernel_funcs import declare_overloads, idle, launches_of
from alchemi_integrators.system_sums import system_sums
from alchemi_integrators.warp_kernels import active_flags, largest_system

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: Image roles (``coeff[b, 0]``).
ENDPOINT, IMAGE, CLIMBING = 0, 1, 2
_ENDPOINT, _IMAGE, _CLIMBING = wp.constant(ENDPOINT), wp.constant(IMAGE), wp.constant(CLIMBING)


@wp.kernel
def _neb_roles(
    energy: wp.array(dtype=Any),
    prev: wp.array(dtype=wp.int64),
    next: wp.array(dtype=wp.int64),
    active: wp.array(dtype=Any),
    climb: wp.array(dtype=Any),
    climb_fmax: wp.array(dtype=Any),
    band_fmax: wp.array(dtype=Any),
    coeff: wp.array2d(dtype=Any),
):
    # coeff[b] = (role, weight of t1, weight of t2).
    b = wp.tid()
    zero = type(energy[b])(0.0)
    one = type(energy[b])(1.0)
    coeff[b, 0] = type(energy[b])(_ENDPOINT)
    coeff[b, 1] = zero
    coeff[b, 2] = zero
    if idle(active, b):
        return
    p = prev[b]
    n = next[b]
    if p < wp.int64(0) or n < wp.int64(0):
        return
    e0 = energy[b]
    em = energy[p]
    ep = energy[n]
    w1 = zero
    w2 = zero
    if ep > e0 and e0 > em:
        w2 = one
    elif ep < e0 and e0 < em:
        w1 = one
    else:
        big = wp.max(wp.abs(ep - e0), wp.abs(em - e0))
        small = wp.min(wp.abs(ep - e0), wp.abs(em - e0))
        if ep > em:
            w2 = big
            w1 = small
        else:
            w2 = small
            w1 = big
    coeff[b, 1] = w1
    coeff[b, 2] = w2
    role = type(energy[b])(_IMAGE)
    if climb[b] > zero and (climb_fmax[b] == zero or band_fmax[b] < climb_fmax[b]):
        # The highest interior image climbs (ties: the last of them, as ASE's argsort), from the
        # start (climb_fmax 0) or once the band's largest force of the step before is below it.
        highest = wp.int32(1)
        q = p
        while prev[q] >= wp.int64(0):
            if energy[q] > e0:
                highest = wp.int32(0)
            q = prev[q]
        q = n
        while next[q] >= wp.int64(0):
            if energy[q] >= e0:
                highest = wp.int32(0)
            q = next[q]
        if highest == 1:
            role = type(energy[b])(_CLIMBING)
    coeff[b, 0] = role


@wp.func
def _minimum_image(d: Any, cell: Any, inv_cell: Any, wrap: Any):
    # d - n cell, n the nearest whole numbers of cells on periodic axes (wrap = 1 there, else 0).
    s = d * inv_cell
    n = type(d)(wp.round(s[0]) * wrap[0], wp.round(s[1]) * wrap[1], wp.round(s[2]) * wrap[2])
    return d - n * cell


@wp.kernel
def _neb_tangents(
    x: wp.array(dtype=Any),
    f: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    ptr: wp.array(dtype=wp.int64),
    prev: wp.array(dtype=wp.int64),
    next: wp.array(dtype=wp.int64),
    coeff: wp.array2d(dtype=Any),
    cell: wp.array(dtype=Any),
    inv_cell: wp.array(dtype=Any),
    wrap: wp.array(dtype=Any),
    tangent: wp.array(dtype=Any),
    values: wp.array(dtype=Any),
    powers: wp.array(dtype=Any),
):
    # tangent[i] (unnormalised); values[i] = (tau.tau, F.tau, 0), powers[i] = (t1.t1, t2.t2, 0).
    i = wp.tid()
    b = system[i]
    xi = x[i]
    zero = xi * type(xi[0])(0.0)
    tangent[i] = zero
    values[i] = zero
    powers[i] = zero
    if coeff[b, 0] == type(xi[0])(_ENDPOINT):
        return
    j = wp.int64(i) - ptr[b]
    t1 = _minimum_image(xi - x[ptr[prev[b]] + j], cell[b], inv_cell[b], wrap[b])
    t2 = _minimum_image(x[ptr[next[b]] + j] - xi, cell[b], inv_cell[b], wrap[b])
    tau = t1 * coeff[b, 1] + t2 * coeff[b, 2]
    tangent[i] = tau
    values[i] = type(xi)(wp.dot(tau, tau), wp.dot(f[i], tau), type(xi[0])(0.0))
    powers[i] = type(xi)(wp.dot(t1, t1), wp.dot(t2, t2), type(xi[0])(0.0))


@wp.kernel
def _neb_project(
    f: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    active: wp.array(dtype=Any),
    coeff: wp.array2d(dtype=Any),
    tangent: wp.array(dtype=Any),
    sums: wp.array(dtype=Any),
    totals: wp.array(dtype=Any),
    k: wp.array(dtype=Any),
    relax_ends: wp.array(dtype=Any),
    f_out: wp.array(dtype=Any),
    fmax: wp.array(dtype=Any),
):
    # The NEB force of atom i into f_out[i] (f_out may be f); its norm into fmax's max. End
    # points feel nothing, or their true force where relax_ends (they relax with the band).
    i = wp.tid()
    b = system[i]
    fi = f[i]
    if idle(active, b):
        f_out[i] = fi
        return
    zero = type(fi[0])(0.0)
    role = coeff[b, 0]
    out = fi * zero
    if role == type(fi[0])(_ENDPOINT):
        if relax_ends[b] > zero:
            out = fi
    else:
        norm = wp.sqrt(sums[b][0])
        scale = zero
        if norm > zero:
            scale = type(fi[0])(1.0) / norm
        tau = tangent[i] * scale
        along = sums[b][1] * scale
        if role == type(fi[0])(_CLIMBING):
            out = fi - tau * (type(fi[0])(2.0) * along)
        else:
            spring = k[b] * (wp.sqrt(totals[b][1]) - wp.sqrt(totals[b][0]))
            out = fi + tau * (spring - along)
    f_out[i] = out
    wp.atomic_max(fmax, wp.int32(b), wp.length(out))


@wp.kernel
def _neb_band_max(
    fmax: wp.array(dtype=Any),
    prev: wp.array(dtype=wp.int64),
    next: wp.array(dtype=wp.int64),
    active: wp.array(dtype=Any),
    band_fmax: wp.array(dtype=Any),
):
    # Every image of a band (its end points too) carries the band's largest force.
    b = wp.tid()
    if idle(active, b):
        return
    m = fmax[b]
    q = prev[b]
    while q >= wp.int64(0):
        m = wp.max(m, fmax[q])
        q = prev[q]
    q = next[b]
    while q >= wp.int64(0):
        m = wp.max(m, fmax[q])
        q = next[q]
    band_fmax[b] = m


wp.init()
declare_overloads([_neb_roles, _neb_tangents, _neb_project, _neb_band_max])


def neb_forces(dyn: Any, batch: Batch, out: torch.Tensor, band_fmax: torch.Tensor | None = None) -> None:
    """The NEB forces of ``batch``'s current forces and energies into ``out`` (``[V, 3]``; may be
    ``batch.forces``), and, when given, each band's largest force into ``band_fmax`` (``[B]``).

    ``dyn`` is the :class:`~alchemi_integrators.neb.NEB` stage: it gives the band's neighbours
    (``dyn.neighbours``), the cells' inverses, the spring constant ``k`` and ``climb``.
    """
    launches = launches_of(dyn)
    dev, dtype = batch.device, batch.positions.dtype
    nb, nv = batch.num_graphs, batch.num_nodes
    prev, nxt = dyn.neighbours(batch)
    cell, inv_cell, wrap = dyn.cells(batch)
    active = active_flags(dyn, batch)
    work = dyn.work
    coeff = work.get("neb_rows", nb, batch.system_capacity, (3,), dtype, dev)
    tangent = work.get("neb_tangent", nv, batch.node_capacity, (3,), dtype, dev)
    values = work.get("neb_values", nv, batch.node_capacity, (3,), dtype, dev)
    powers = work.get("neb_powers", nv, batch.node_capacity, (3,), dtype, dev)
    sums = work.get("neb_sums", nb, batch.system_capacity, (3,), dtype, dev)
    totals = work.get("neb_totals", nb, batch.system_capacity, (3,), dtype, dev)
    fmax = work.get("neb_fmax", nb, batch.system_capacity, (), dtype, dev)
    energy = batch.energy.view(-1)
    per = dyn.per_system
    args = (energy, prev, nxt, active, per("climb", batch), per("climb_fmax", batch), dyn.band_fmax(batch), coeff)
    launches.launch("neb_roles", _neb_roles, nb, args, dev)
    args = (batch.positions, batch.forces, batch.batch_idx, batch.batch_ptr, prev, nxt, coeff, cell, inv_cell, wrap,
            tangent, values, powers)
    launches.launch("neb_tangents", _neb_tangents, nv, args, dev)
    sums.zero_()
    totals.zero_()
    largest = largest_system(dyn, batch)
    system_sums(launches, work, "neb_values", values, batch.batch_idx, sums, largest)
    system_sums(launches, work, "neb_powers", powers, batch.batch_idx, totals, largest)
    fmax.zero_()
    args = (batch.forces, batch.batch_idx, active, coeff, tangent, sums, totals, per("k", batch),
            per("relax_endpoints", batch), out, fmax)
    launches.launch("neb_project", _neb_project, nv, args, dev)
    if band_fmax is not None:
        launches.launch("neb_band_max", _neb_band_max, nb, (fmax, prev, nxt, active, band_fmax), dev)
