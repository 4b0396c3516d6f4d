"""The pair kernel's CPU variant with a slot's neighbours in SIMD lanes (``PairOptions.lanes``).

The kernel hands each slot to a native C++ snippet (compiled by Warp's clang for the host CPU)
that takes ``lane_width`` neighbours at a time (``wide_lane_width`` under AVX-512) in fixed-length
loops the compiler vectorises; only the Newton's-third-law updates stay one pair at a time. It
computes what the kernel computes without ``lanes`` for the options it covers (:func:`covers`),
to rounding (sums run lane by lane, then across lanes).

Example:
    >>> from alchemi_potentials.pair_forces import PairOptions, pair_kernel
    >>> kernel = pair_kernel(PairOptions(half=True, lanes=True))
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import warp as wp

from alchemi_potentials.pair_kernels import LENNARD_JONES

if TYPE_CHECKING:
    from alchemi_potentials.pair_forces import PairOptions

# One slot's row. Entries past ``n`` in the last block repeat entry ``n - 1`` and are masked.
_ROW = r"""
using T = decltype(cutoff_sq);
#if defined(__AVX512F__)
constexpr int L = WIDE_LANES_;
#else
constexpr int L = LANES_;
#endif
const int s = *(const int*)((const char*)lists_system.data + t * lists_system.strides[0]);
const T* yi = (const T*)((const char*)wrapped.data + t * wrapped.strides[0]);
const T* m = (const T*)((const char*)image_cell.data + s * image_cell.strides[0]);
const int first = *(const int*)((const char*)lists_first.data + s * lists_first.strides[0]);
const int bits = *(const int*)((const char*)lists_bits.data + s * lists_bits.strides[0]);
const int ib = (31 - bits) / 3 < 10 ? (31 - bits) / 3 : 10;
const int slot_mask = (1 << bits) - 1, image_mask = (1 << ib) - 1, bias = 1 << (ib - 1);
const int n = *(const int*)((const char*)lists_count.data + t * lists_count.strides[0]);
const char* column = (const char*)lists_entries.data + t * lists_entries.strides[1];
const long long row_stride = lists_entries.strides[0];
const long long ws = wrapped.strides[0];
const char* pos = (const char*)wrapped.data;
const T x0 = yi[0], y0 = yi[1], z0 = yi[2];
// Sums kept per lane (vector adds, no dependency chain across lanes), added up at the end.
T se[L], sx[L], sy[L], sz[L];
for (int l = 0; l < L; ++l) { se[l] = T(0); sx[l] = T(0); sy[l] = T(0); sz[l] = T(0); }
#if VIRIAL_
T lw[9][L];
for (int q = 0; q < 9; ++q) for (int l = 0; l < L; ++l) lw[q][l] = T(0);
#endif
// One block of L entries from k0; whole blocks of a contiguous row: plain vector loads.
const int* col = (const int*)column;
const long long es = row_stride / (long long)sizeof(int);
auto block = [&](const int k0, const int limit, const long long stride) {
    int u[L];
    T dx[L], dy[L], dz[L], g[L], en[L];
    for (int l = 0; l < L; ++l) {
        const int k = k0 + l < limit ? k0 + l : limit - 1;
        const int c = col[k * stride];
        const int h = c >> bits;
        const T mx = T((h & image_mask) - bias);
        const T my = T(((h >> ib) & image_mask) - bias);
        const T mz = T(((h >> (2 * ib)) & image_mask) - bias);
        u[l] = first + (c & slot_mask);
        const T* yu = (const T*)(pos + u[l] * ws);
        dx[l] = yu[0] - x0 + mx * m[0] + my * m[3] + mz * m[6];
        dy[l] = yu[1] - y0 + mx * m[1] + my * m[4] + mz * m[7];
        dz[l] = yu[2] - z0 + mx * m[2] + my * m[5] + mz * m[8];
    }
    for (int l = 0; l < L; ++l) {
        const T r2 = dx[l] * dx[l] + dy[l] * dy[l] + dz[l] * dz[l];
        const T inside = (r2 < cutoff_sq && k0 + l < limit) ? T(1) : T(0);
        const T inv = T(1) / r2;
        const T s2 = b * inv;
        const T s6 = s2 * s2 * s2;
        en[l] = inside * (a * (s6 * s6 - s6) - shift);
        g[l] = inside * a * (T(6) * s6 - T(12) * s6 * s6) * inv;
    }
    for (int l = 0; l < L; ++l) {
        se[l] += en[l];
        sx[l] += g[l] * dx[l];
        sy[l] += g[l] * dy[l];
        sz[l] += g[l] * dz[l];
    }
#if VIRIAL_
    for (int l = 0; l < L; ++l) {
        const T gx = g[l] * dx[l], gy = g[l] * dy[l], gz = g[l] * dz[l];
        lw[0][l] += gx * dx[l]; lw[1][l] += gx * dy[l]; lw[2][l] += gx * dz[l];
        lw[3][l] += gy * dx[l]; lw[4][l] += gy * dy[l]; lw[5][l] += gy * dz[l];
        lw[6][l] += gz * dx[l]; lw[7][l] += gz * dy[l]; lw[8][l] += gz * dz[l];
    }
#endif
#if HALF_
    for (int l = 0; l < L; ++l) {
        const int j = *(const int*)((const char*)lists_order.data + u[l] * lists_order.strides[0]);
        T* fj = (T*)((char*)forces.data + j * forces.strides[0]);
        fj[0] -= g[l] * dx[l];
        fj[1] -= g[l] * dy[l];
        fj[2] -= g[l] * dz[l];
    }
#endif
};
int k0 = 0;
if (es == 1) {
    for (; k0 + L <= n; k0 += L) block(k0, k0 + L, 1);
}
for (; k0 < n; k0 += L) block(k0, n, es);
T e = T(0), fx = T(0), fy = T(0), fz = T(0);
for (int l = 0; l < L; ++l) { e += se[l]; fx += sx[l]; fy += sy[l]; fz += sz[l]; }
#if VIRIAL_
T w[9];
for (int q = 0; q < 9; ++q) { w[q] = T(0); for (int l = 0; l < L; ++l) w[q] += lw[q][l]; }
#endif
const int i = *(const int*)((const char*)lists_order.data + t * lists_order.strides[0]);
T* fi = (T*)((char*)forces.data + i * forces.strides[0]);
#if HALF_
const T weight = T(1);
fi[0] += fx; fi[1] += fy; fi[2] += fz;
#else
const T weight = T(0.5);
fi[0] = fx; fi[1] = fy; fi[2] = fz;
#endif
#if PER_SLOT_
*(T*)((char*)slot_energy.data + t * slot_energy.strides[0]) = weight * e;
#if VIRIAL_
T* sw = (T*)((char*)slot_virial.data + t * slot_virial.strides[0]);
for (int q = 0; q < 9; ++q) sw[q] = weight * w[q];
#endif
#else
*(T*)((char*)energy.data + s * energy.strides[0]) += weight * e;
#if VIRIAL_
T* sv = (T*)((char*)virial.data + s * virial.strides[0]);
for (int q = 0; q < 9; ++q) sv[q] += weight * w[q];
#endif
#endif
"""


def _row_stub(module: str, scalar: Any, vec: Any, mat: Any) -> Any:
    """The typed stub of one slot's row (the snippet is its body), for one precision."""

    def row(t, wrapped, image_cell, lists_entries, lists_count, lists_order, lists_system, lists_first,
            lists_bits, a, b, shift, cutoff_sq, forces, energy, virial, slot_energy, slot_virial):
        ...

    ints = wp.array(dtype=wp.int32)
    # Set here, not as annotations: this module's annotations are strings, and these are values.
    row.__annotations__ = {
        "t": int, "wrapped": wp.array(dtype=vec), "image_cell": wp.array(dtype=mat),
        "lists_entries": wp.array2d(dtype=wp.int32), "lists_count": ints, "lists_order": ints,
        "lists_system": ints, "lists_first": ints, "lists_bits": ints, "a": scalar, "b": scalar,
        "shift": scalar, "cutoff_sq": scalar, "forces": wp.array(dtype=vec), "energy": wp.array(dtype=scalar),
        "virial": wp.array(dtype=mat), "slot_energy": wp.array(dtype=scalar), "slot_virial": wp.array(dtype=mat),
    }  # fmt: skip
    row.__module__ = module
    return row


def covers(options: PairOptions) -> bool:
    """Whether the lanes compute ``options``' variant."""
    return options.kind == LENNARD_JONES and options.one_type and not options.switching and not options.force_shift


@functools.cache
def row_function(options: PairOptions) -> Any:
    """The native function of one slot's row for ``options`` (see :func:`covers`), overloaded
    for float32 and float64; :func:`~alchemi_potentials.pair_forces.pair_kernel` calls it."""
    assert covers(options), options
    snippet = _ROW
    # WIDE_LANES_ first: LANES_ is part of its name.
    for name, value in (("WIDE_LANES_", options.wide_lane_width), ("LANES_", options.lane_width), ("VIRIAL_", int(options.virial)),
                        ("HALF_", int(options.half)), ("PER_SLOT_", int(options.per_slot))):
        snippet = snippet.replace(name, str(value))
    module = f"alchemi_potentials.pair_forces.{options.tag}"  # the kernel's module
    row = None
    for scalar, vec, mat in ((wp.float32, wp.vec3f, wp.mat33f), (wp.float64, wp.vec3d, wp.mat33d)):
        # Warp adds an overload to the function of the same name in the caller's locals: ``row``.
        row = wp.func_native(snippet)(_row_stub(module, scalar, vec, mat))
    return row
