"""The pair kernel: energies, forces and virials of every atom from its neighbour entries.

One thread per slot walks its packed entries and sums, for every neighbour within the cutoff at
``d = wrapped[u] - wrapped[t] + m @ image_cell``, the force ``g d`` (``g = U'(r) / r``), half the
pair energy and half the virial ``g d (x) d`` (a half list: the whole, and ``-g d`` on the
neighbour too). Totals go to the system by one atomic add per atom, or for large systems per slot
and then chunk by chunk (``fold_totals``). Each combination of :class:`PairOptions` is its own
kernel in its own Warp module: what is off is absent from the code (fewer registers).

Example:
    >>> kernel = pair_kernel(PairOptions(kind=LENNARD_JONES, unroll=4))
"""

from __future__ import annotations

import functools
from typing import Any

import attrs
import warp as wp

from alchemi_potentials import pair_lanes
from alchemi_potentials.neighbors.entries import entry_image, entry_slot, image_bits_for
from alchemi_potentials.neighbors.kernels import PairList
from alchemi_potentials.neighbors.layout import COLUMNS_MULTIPLE_OF
from alchemi_potentials.pair_kernels import LENNARD_JONES, image_vector, pair_terms, switched, type_of


@attrs.frozen
class PairOptions:
    """What one pair kernel variant does (each combination is its own kernel).

    Attributes:
        kind: ``LENNARD_JONES`` or ``MORSE``.
        force_shift: Subtract ``slope r`` from pair energies (the row's fifth column is
            ``slope = U'(r_cut)``), the linear term of the shifted-force potential.
        switching: Multiply energies by the smooth switch between onset and cutoff.
        virial: Accumulate virials (for stress).
        half: Each pair listed once: also update the neighbour's force.
        one_type: One species: parameters are loop constants.
        per_slot: Write per-slot energies (and virials) for ``fold_totals``, instead of atomic
            adds into the systems' totals.
        unroll: Neighbours per iteration: 1, 2 or 4.
        masked: Multiply pairs past the cutoff by zero instead of branching around them.
        fast_math: Compile with CUDA's fast math (float32 only).
        lanes: A CPU's variant with a slot's neighbours in SIMD lanes
            (:mod:`~alchemi_potentials.pair_lanes`; :func:`~alchemi_potentials.pair_lanes.covers`).
        min_blocks: On a GPU, blocks of 256 threads that must fit on one multiprocessor
            (CUDA's ``__launch_bounds__``); 0 leaves the compiler its choice.
        lane_width: Neighbours per block of the lanes' native loop; ``wide_lane_width`` where the
            compiler targets AVX-512.
    """

    kind: int = LENNARD_JONES
    force_shift: bool = False
    switching: bool = False
    virial: bool = False
    half: bool = False
    one_type: bool = True
    per_slot: bool = False
    unroll: int = attrs.field(default=1, validator=attrs.validators.in_((1, 2, 4)))
    masked: bool = False
    lanes: bool = False
    fast_math: bool = False
    min_blocks: int = 0
    lane_width: int = 8
    wide_lane_width: int = 16

    def __attrs_post_init__(self) -> None:
        assert COLUMNS_MULTIPLE_OF % self.unroll == 0
        assert not self.lanes or pair_lanes.covers(self), self

    @property
    def tag(self) -> str:
        flags = "".join(str(int(v)) for v in (self.force_shift, self.switching, self.virial, self.half, self.one_type, self.per_slot,
                                              self.masked, self.lanes, self.fast_math))
        blocks = f"_b{self.min_blocks}" if self.min_blocks else ""
        widths = f"_l{self.lane_width}x{self.wide_lane_width}" if self.lanes else ""
        return f"k{self.kind}_{flags}_u{self.unroll}{blocks}{widths}"


@functools.cache
def pair_kernel(options: PairOptions) -> Any:
    """The pair kernel for ``options``, with float32 and float64 instances declared."""
    KIND, SWITCHING, VIRIAL, HALF = options.kind, options.switching, options.virial, options.half
    ONE_TYPE, PER_SLOT, UNROLL, MASKED = options.one_type, options.per_slot, options.unroll, options.masked
    LANES, FORCE_SHIFT = options.lanes, options.force_shift
    lanes_row = pair_lanes.row_function(options) if LANES else None

    def add_pair(
        d: Any,
        u: int,
        lists: PairList,
        type_lut: wp.array(dtype=wp.int32),
        unknown: int,
        row_base: int,
        params: wp.array2d(dtype=Any),
        pa: Any,
        pb: Any,
        pc: Any,
        ps: Any,
        pd: Any,
        cutoff_sq: Any,
        switch_on: Any,
        cutoff: Any,
        forces: wp.array(dtype=Any),
        e: Any,
        f: Any,
        w: Any,
    ):
        """The sums after adding the pair at displacement ``d`` (neighbour slot ``u``)."""
        r2 = wp.dot(d, d)
        e_out = e
        f_out = f
        w_out = w
        if wp.static(MASKED) or r2 < cutoff_sq:
            a = pa
            b = pb
            c = pc
            shift = ps
            slope = pd
            if wp.static(not ONE_TYPE):
                row = row_base + type_of(type_lut, lists.slot_number[u], unknown)
                a = params[row, 0]
                b = params[row, 1]
                c = params[row, 2]
                shift = params[row, 3]
                if wp.static(FORCE_SHIFT):
                    slope = params[row, 4]
            energy, g = pair_terms(KIND, r2, a, b, c)
            energy = energy - shift
            if wp.static(FORCE_SHIFT):
                # U_sf = U - U(r_c) - (r - r_c) U'(r_c): the constant part is in ``shift``.
                r = wp.sqrt(r2)
                energy = energy - slope * r
                g = g - slope / r
            if wp.static(SWITCHING):
                energy, g = switched(energy, g, r2, switch_on, cutoff)
            if wp.static(MASKED):
                # Past the cutoff the terms are finite: zeroed (a select, not wp.where: Warp 1.5).
                inside = type(r2)(0.0)
                if r2 < cutoff_sq:
                    inside = type(r2)(1.0)
                energy = energy * inside
                g = g * inside
            fij = g * d
            e_out = e + energy
            f_out = f + fij
            if wp.static(HALF):
                wp.atomic_sub(forces, lists.order[u], fij)  # Newton's third law; plain adds on a CPU
            if wp.static(VIRIAL):
                w_out = w + wp.outer(fij, d)
        return e_out, f_out, w_out

    def pair_forces(
        wrapped: wp.array(dtype=Any),
        image_cell: wp.array(dtype=Any),
        lists: PairList,
        type_lut: wp.array(dtype=wp.int32),
        unknown: int,
        table_stride: int,
        params: wp.array2d(dtype=Any),
        cutoff_sq: Any,
        switch_on: Any,
        cutoff: Any,
        forces: wp.array(dtype=Any),
        energy: wp.array(dtype=Any),
        virial: wp.array(dtype=Any),
        slot_energy: wp.array(dtype=Any),
        slot_virial: wp.array(dtype=Any),
    ):
        t = wp.tid()
        if wp.static(LANES):
            # One species: the slot's own row holds every pair's parameters (NaN for an unknown
            # element, as below).
            tl = type_of(type_lut, lists.slot_number[t], unknown)
            p = tl * table_stride + tl
            lanes_row(t, wrapped, image_cell, lists.entries, lists.count, lists.order, lists.system,
                      lists.first_atom, lists.index_bits, params[p, 0], params[p, 1], params[p, 3], cutoff_sq,
                      forces, energy, virial, slot_energy, slot_virial)
            return
        s = lists.system[t]
        yi = wrapped[t]
        m = image_cell[s]
        first = lists.first_atom[s]
        bits = lists.index_bits[s]
        ibits = image_bits_for(bits)
        zero = cutoff_sq - cutoff_sq
        f = yi * zero
        w = m * zero
        e = zero
        ti = type_of(type_lut, lists.slot_number[t], unknown)
        row_base = ti * table_stride
        # With one species these are the parameters of every pair.
        pa = params[row_base + ti, 0]
        pb = params[row_base + ti, 1]
        pc = params[row_base + ti, 2]
        ps = params[row_base + ti, 3]
        pd = zero
        if wp.static(FORCE_SHIFT):
            pd = params[row_base + ti, 4]
        n = lists.count[t]
        # Entries past n up to the next multiple of COLUMNS_MULTIPLE_OF are valid: loaded, not added.
        for k in range(0, n, UNROLL):
            c0 = lists.entries[k, t]
            if wp.static(UNROLL >= 2):
                c1 = lists.entries[k + 1, t]
            if wp.static(UNROLL == 4):
                c2 = lists.entries[k + 2, t]
                c3 = lists.entries[k + 3, t]
            u0 = first + entry_slot(c0, bits)
            d0 = wrapped[u0] - yi + image_vector(entry_image(c0, bits, ibits), m)
            if wp.static(UNROLL >= 2):
                u1 = first + entry_slot(c1, bits)
                d1 = wrapped[u1] - yi + image_vector(entry_image(c1, bits, ibits), m)
            if wp.static(UNROLL == 4):
                u2 = first + entry_slot(c2, bits)
                u3 = first + entry_slot(c3, bits)
                d2 = wrapped[u2] - yi + image_vector(entry_image(c2, bits, ibits), m)
                d3 = wrapped[u3] - yi + image_vector(entry_image(c3, bits, ibits), m)
            e, f, w = add_pair(d0, u0, lists, type_lut, unknown, row_base, params, pa, pb, pc, ps, pd, cutoff_sq,
                               switch_on, cutoff, forces, e, f, w)
            if wp.static(UNROLL >= 2):
                if k + 1 < n:
                    e, f, w = add_pair(d1, u1, lists, type_lut, unknown, row_base, params, pa, pb, pc, ps, pd,
                                       cutoff_sq, switch_on, cutoff, forces, e, f, w)
            if wp.static(UNROLL == 4):
                if k + 2 < n:
                    e, f, w = add_pair(d2, u2, lists, type_lut, unknown, row_base, params, pa, pb, pc, ps, pd,
                                       cutoff_sq, switch_on, cutoff, forces, e, f, w)
                if k + 3 < n:
                    e, f, w = add_pair(d3, u3, lists, type_lut, unknown, row_base, params, pa, pb, pc, ps, pd,
                                       cutoff_sq, switch_on, cutoff, forces, e, f, w)
        i = lists.order[t]
        # A full list sees every pair twice, a half list once.
        weight = type(zero)(0.5)
        if wp.static(HALF):
            weight = type(zero)(1.0)
            wp.atomic_add(forces, i, f)
        else:
            forces[i] = f
        if wp.static(PER_SLOT):
            slot_energy[t] = weight * e
            if wp.static(VIRIAL):
                slot_virial[t] = weight * w
        else:
            wp.atomic_add(energy, s, weight * e)
            if wp.static(VIRIAL):
                wp.atomic_add(virial, s, weight * w)

    # Each variant in a Warp module of its own (Warp groups kernels by their function's module).
    add_pair.__module__ = pair_forces.__module__ = f"{__name__}.{options.tag}"
    add_pair = wp.func(add_pair)  # the kernel finds it through its closure, at code generation
    kernel = wp.kernel(pair_forces, enable_backward=False)
    if options.fast_math:
        kernel.module.options["fast_math"] = True
    if options.min_blocks:
        # Read at code generation; the launch's blocks are Warp's default 256 threads.
        kernel.options["launch_bounds"] = (256, options.min_blocks)
    for scalar, vec, mat in ((wp.float32, wp.vec3f, wp.mat33f), (wp.float64, wp.vec3d, wp.mat33d)):
        wp.overload(kernel, {
            "wrapped": wp.array(dtype=vec), "image_cell": wp.array(dtype=mat), "params": wp.array2d(dtype=scalar),
            "cutoff_sq": scalar, "switch_on": scalar, "cutoff": scalar, "forces": wp.array(dtype=vec),
            "energy": wp.array(dtype=scalar), "virial": wp.array(dtype=mat), "slot_energy": wp.array(dtype=scalar),
            "slot_virial": wp.array(dtype=mat),
        })  # fmt: skip
    return kernel
