"""Langevin's B-A-O-A step on a CPU with a system's atoms in SIMD lanes: one launch, a thread per
system (:func:`launch`).

On a CPU the Warp backend's general path (:mod:`~alchemi_integrators.warp_kernels`) costs about
100 ns an atom, nearly all of it Warp's scalar Gaussian draws (three per atom, each a Box-Muller
pair of which half is thrown away, through the C library's ``log`` and ``cos``), and torch's step
about 50 ns (a dozen small operations and ``normal_``). Here each system is one native snippet
(compiled by Warp's clang for the host CPU, as :mod:`alchemi_potentials.pair_lanes` is) that steps
:data:`LANES` atoms at a time: the draws in explicit vectors of eight lanes, with ``log`` and
``cos`` as polynomials fitted for this module (within 2e-7 of the exact functions in float32)
and the square root by Newton's method, then the half-kick, the drifts and the friction lane by
lane. About 20 ns an atom: W6's 6,912 atoms in 0.12-0.18 ms.

The draws are Warp's: the same counter-based generator (``rand_init`` keyed by seed, system id,
the system's step count and the atom's place in its system, then ``randn`` three times), so a
system gets the same noise here as from the Warp kernels on any device, whatever its place in the
batch or the number of threads, and the trajectory agrees with theirs to the rounding of the
draws (Warp's own ``cos`` takes its angle rounded to float32) and of the momentum sums' order.
With the centre of mass held, each system's noise momentum is summed in lanes and taken out of
its own atoms before the second drift. The kernel also counts the system's step (the general
path counts it in its last half-kick), so that the step's last half-kick can be torch's one
vectorised operation, which costs less than a launch and its arguments.

Example:
    >>> import torch
    >>> fits(torch.device("cpu")), fits(torch.device("cuda"))
    (True, False)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import warp as wp

from alchemi_core.warp_runtime import range_handoff
from alchemi_integrators.kernel_funcs import declare_overloads

if TYPE_CHECKING:
    from alchemi_core.data import Batch
    from alchemi_core.warp_runtime import RecordedLaunches

#: Atoms per block of the native loops (eight float32 lanes of AVX2).
LANES = 8
#: Whether the Warp backend's Langevin step takes this path, by device type (a GPU has its own,
#: :mod:`~alchemi_integrators.langevin_blocks`); tests turn it off to reach the general path.
BY_DEVICE = {"cpu": True}
#: Atoms from which the systems are stepped in ranges on the CPU's threads, by how ranges are
#: handed over (``warp_runtime.range_handoff``). The step costs about 20 ns an atom; handing ranges
#: to a sleeping worker thread 100-200 us on a 2-core virtual machine, to a spinning one a few us.
#: W6's 6,912 atoms on a 2-core Xeon, spinning workers: 1.33-1.40 ms a step in ranges against
#: 1.44-1.48 as one launch (three alternating pairs of runs).
CHUNKED_FROM = {"spinning": 4096, "sleeping": 32768}

# One system. Warp's generator, lane by lane: rand_pcg (a hash of 32-bit words), rand_init(seed,
# offset) = pcg(seed + pcg(offset)), randf = the top 24 bits of the next pcg state over 2^24, and
# randn = sqrt(-2 log(u1 + 2^-24)) cos(2 pi u2) (RANDN_EPSILON is 5.96e-8f). Warp's headers define
# float(x) and int(x) as macros: casts here are static_cast.
_SYSTEM = r"""
using T = decltype(kb);
constexpr int L = LANES_;
const T* act = (const T*)((const char*)active.data + b * active.strides[0]);
if (*act == T(0)) return;
const long long lo = *(const long long*)((const char*)first_atom.data + b * first_atom.strides[0]);
const long long hi = *(const long long*)((const char*)first_atom.data + (b + 1) * first_atom.strides[0]);
const T dtb = *(const T*)((const char*)dt.data + b * dt.strides[0]);
const T gamma = *(const T*)((const char*)friction.data + b * friction.strides[0]);
const T temp = *(const T*)((const char*)temperature.data + b * temperature.strides[0]);
const T h = T(0.5) * dtb;
const T c1 = exp(-gamma * dtb);
// sigma = sqrt((1 - c1^2) kB T / m), as the root of the system's part times the atom's.
const T root_fluctuation = sqrt((T(1) - c1 * c1) * kb * temp);
// Warp's rand_pcg, for one word or eight lanes of them (u8v below).
auto pcg = [](auto s) {
    const auto q = s * 747796405u + 2891336453u;
    const auto c = ((q >> ((q >> 28u) + 4u)) ^ q) * 277803737u;
    return (c >> 22u) ^ c;
};
const long long sid = *(const long long*)((const char*)system_id.data + b * system_id.strides[0]);
int* counter = (int*)((char*)noise_step.data + b * noise_step.strides[0]);
const int step = *counter;
*counter = step + 1;  // the system's step is counted here (the last half-kick is torch's)
unsigned int base = pcg((unsigned int)seed + pcg((unsigned int)(int)sid));
base = pcg(base + pcg((unsigned int)step));
const char* xd = (const char*)x.data; const long long xs = x.strides[0];
const char* vd = (const char*)v.data; const long long vs = v.strides[0];
const char* fd = (const char*)f.data; const long long fs = f.strides[0];
const char* imd = (const char*)inv_mass.data; const long long ims = inv_mass.strides[0];
const char* md = (const char*)mass.data; const long long ms = mass.strides[0];
const char* rmd = (const char*)root_inv_mass.data; const long long rms = root_inv_mass.strides[0];
// The draws in explicit vectors of eight lanes (GCC/Clang vector extensions; comparisons give
// lanes of 0 or -1, casts between vector types keep the bits): plain loops with selects were
// left scalar by the compiler.
typedef unsigned int u8v __attribute__((vector_size(32)));
typedef int i8v __attribute__((vector_size(32)));
typedef float f8v __attribute__((vector_size(32)));
auto select = [](i8v mask, f8v a, f8v b) { return (f8v)((mask & (i8v)a) | (~mask & (i8v)b)); };
const u8v lane = {0u, 1u, 2u, 3u, 4u, 5u, 6u, 7u};
T px[L], py[L], pz[L];
for (int l = 0; l < L; ++l) { px[l] = T(0); py[l] = T(0); pz[l] = T(0); }
for (long long i0 = lo; i0 < hi; i0 += L) {
    // The last block's lanes past hi repeat atom hi - 1 and write nothing.
    T im[L], rm[L], vx[L], vy[L], vz[L], fx[L], fy[L], fz[L];
    for (int l = 0; l < L; ++l) {
        const long long i = i0 + l < hi ? i0 + l : hi - 1;
        im[l] = *(const T*)(imd + i * ims);
        rm[l] = *(const T*)(rmd + i * rms);
        const T* vi = (const T*)(vd + i * vs);
        const T* fi = (const T*)(fd + i * fs);
        vx[l] = vi[0]; vy[l] = vi[1]; vz[l] = vi[2];
        fx[l] = fi[0]; fy[l] = fi[1]; fz[l] = fi[2];
    }
    u8v state = pcg(base + pcg(lane + (unsigned int)(i0 - lo)));
    float n[3][L];
    for (int c = 0; c < 3; ++c) {
        const u8v s1 = pcg(state);
        const u8v s2 = pcg(s1);
        state = s2;
        const f8v u1 = __builtin_convertvector((i8v)(s1 >> 8u), f8v) * (1.0f / 16777216.0f) + 5.96e-8f;
        const f8v u2 = __builtin_convertvector((i8v)(s2 >> 8u), f8v) * (1.0f / 16777216.0f);
        // log(u1) = e ln 2 + log(m), m in [sqrt(1/2), sqrt(2)); log(1 + t) = t Q(t).
        const i8v bits = (i8v)u1;
        i8v e = ((bits >> 23) & 255) - 126;
        f8v m = (f8v)((bits & 8388607) | 1056964608);  // the mantissa, exponent of [0.5, 1)
        const i8v low = m < 0.707106781f;
        m = m + (f8v)((i8v)m & low);
        e = e + low;  // -1 where doubled
        const f8v t = m - 1.0f;
        f8v q = t * 0.0874394551f - 0.143773302f;
        q = q * t + 0.149490952f; q = q * t - 0.165606961f; q = q * t + 0.199569777f;
        q = q * t - 0.250021547f; q = q * t + 0.333341837f; q = q * t - 0.499999881f; q = q * t + 1.0f;
        const f8v y = __builtin_convertvector(e, f8v) * -1.38629436f - 2.0f * t * q;  // -2 log(u1)
        // cos(2 pi u2): a = |u2 - round(u2)| in [0, 1/2], folded onto [0, 1/4] around 1/4
        // (r = 1/2 - a, the sign flipped); cos(2 pi r) a polynomial in r^2.
        const f8v w = u2 - (f8v)((u2 >= 0.5f) & 1065353216);  // the bits of 1.0f
        const f8v a = (f8v)((i8v)w & 2147483647);
        const i8v far = a > 0.25f;
        const f8v r = select(far, 0.5f - a, a);
        const f8v r2 = r * r;
        f8v p = r2 * -25.0067844f + 60.1480637f;
        p = p * r2 - 85.4538116f; p = p * r2 + 64.9393539f; p = p * r2 - 19.7392082f; p = p * r2 + 1.0f;
        p = (f8v)((i8v)p ^ (far & (-2147483647 - 1)));  // the sign bit
        // sqrt(y) = y / sqrt(y), by three Newton steps from the bit-pattern estimate (float32
        // rounding; the C library's sqrtf may set errno, which keeps loops scalar).
        f8v rs = (f8v)(1597463007 - ((i8v)y >> 1));
        rs = rs * (1.5f - 0.5f * y * rs * rs);
        rs = rs * (1.5f - 0.5f * y * rs * rs);
        rs = rs * (1.5f - 0.5f * y * rs * rs);
        const f8v draw = y * rs * p;
        __builtin_memcpy(n[c], &draw, sizeof(draw));
    }
    // B (v + dt/2 F/m), A, O, lane by lane; then the stores (the last block's live lanes only).
    T bx[L], by[L], bz[L], nx[L], ny[L], nz[L], ox[L], oy[L], oz[L];
    for (int l = 0; l < L; ++l) {
        const T k = h * im[l];
        bx[l] = vx[l] + fx[l] * k; by[l] = vy[l] + fy[l] * k; bz[l] = vz[l] + fz[l] * k;
        const T sigma = root_fluctuation * rm[l];
        nx[l] = T(n[0][l]) * sigma; ny[l] = T(n[1][l]) * sigma; nz[l] = T(n[2][l]) * sigma;
        ox[l] = bx[l] * c1 + nx[l]; oy[l] = by[l] * c1 + ny[l]; oz[l] = bz[l] * c1 + nz[l];
    }
    const int live = hi - i0 < L ? static_cast<int>(hi - i0) : L;
    for (int l = 0; l < live; ++l) {
        T* vi = (T*)(vd + (i0 + l) * vs);
        vi[0] = ox[l]; vi[1] = oy[l]; vi[2] = oz[l];
    }
    if (fix_com) {
        // The first A now, the second after the COM correction; the noise momentum summed per lane.
        for (int l = 0; l < live; ++l) {
            T* xi = (T*)(xd + (i0 + l) * xs);
            xi[0] += bx[l] * h; xi[1] += by[l] * h; xi[2] += bz[l] * h;
            const T mi = *(const T*)(md + (i0 + l) * ms);
            px[l] += nx[l] * mi; py[l] += ny[l] * mi; pz[l] += nz[l] * mi;
        }
    } else {
        for (int l = 0; l < live; ++l) {
            T* xi = (T*)(xd + (i0 + l) * xs);
            xi[0] = (xi[0] + bx[l] * h) + ox[l] * h;
            xi[1] = (xi[1] + by[l] * h) + oy[l] * h;
            xi[2] = (xi[2] + bz[l] * h) + oz[l] * h;
        }
    }
}
if (fix_com) {
    T sx = T(0), sy = T(0), sz = T(0);
    for (int l = 0; l < L; ++l) { sx += px[l]; sy += py[l]; sz += pz[l]; }
    const T total = *(const T*)((const char*)total_mass.data + b * total_mass.strides[0]);
    const T dx = sx / total, dy = sy / total, dz = sz / total;
    for (long long i = lo; i < hi; ++i) {
        T* xi = (T*)(xd + i * xs);
        T* vi = (T*)(vd + i * vs);
        vi[0] -= dx; vi[1] -= dy; vi[2] -= dz;
        xi[0] += vi[0] * h; xi[1] += vi[1] * h; xi[2] += vi[2] * h;
    }
}
"""


def _system_stub(scalar: Any, vec: Any) -> Any:
    """The typed stub of one system's step (the snippet is its body), for one precision."""

    def step_system(b, x, v, f, inv_mass, root_inv_mass, mass, first_atom, system_id, noise_step, dt, friction, temperature,
                    active, total_mass, kb, seed, fix_com):
        ...

    vectors, scalars = wp.array(dtype=vec), wp.array(dtype=scalar)
    # Set here, not as annotations: this module's annotations are strings, and these are values.
    step_system.__annotations__ = {
        "b": int, "x": vectors, "v": vectors, "f": vectors, "inv_mass": scalars, "root_inv_mass": scalars,
        "mass": scalars,
        "first_atom": wp.array(dtype=wp.int64), "system_id": wp.array(dtype=wp.int64),
        "noise_step": wp.array(dtype=wp.int32), "dt": scalars, "friction": scalars, "temperature": scalars,
        "active": scalars, "total_mass": scalars, "kb": scalar, "seed": wp.int32, "fix_com": wp.int32,
    }  # fmt: skip
    return step_system


step_system = None
for _scalar, _vec in ((wp.float32, wp.vec3f), (wp.float64, wp.vec3d)):
    # Warp adds an overload to the function of the same name in the caller's scope.
    step_system = wp.func_native(_SYSTEM.replace("LANES_", str(LANES)))(_system_stub(_scalar, _vec))


@wp.kernel
def _langevin_lanes(
    x: wp.array(dtype=Any),
    v: wp.array(dtype=Any),
    f: wp.array(dtype=Any),
    inv_mass: wp.array(dtype=Any),
    root_inv_mass: wp.array(dtype=Any),
    mass: wp.array(dtype=Any),
    first_atom: wp.array(dtype=wp.int64),
    system_id: wp.array(dtype=wp.int64),
    noise_step: wp.array(dtype=wp.int32),
    dt: wp.array(dtype=Any),
    friction: wp.array(dtype=Any),
    temperature: wp.array(dtype=Any),
    active: wp.array(dtype=Any),
    total_mass: wp.array(dtype=Any),
    kb: Any,
    seed: wp.int32,
    fix_com: wp.int32,
    start: int,
):
    # One system per thread; a CPU runs ranges of the systems on its threads (start: the range's first).
    step_system(wp.tid() + start, x, v, f, inv_mass, root_inv_mass, mass, first_atom, system_id, noise_step, dt, friction,
                temperature, active, total_mass, kb, seed, fix_com)


declare_overloads([_langevin_lanes])


def fits(device: torch.device) -> bool:
    """Whether the Warp backend's Langevin step on ``device`` takes this path."""
    return BY_DEVICE.get(device.type, False)


def launch(launches: RecordedLaunches, batch: Batch, args: tuple[Any, ...]) -> None:
    """Step every system of ``batch``: ``args`` are the kernel's arguments up to ``fix_com``.
    From :data:`CHUNKED_FROM` atoms the systems run in ranges on the CPU's threads."""
    in_ranges = batch.num_nodes >= CHUNKED_FROM[range_handoff()]
    launches.launch("baoa_lanes", _langevin_lanes, batch.num_graphs, (*args, 0), batch.device,
                    start_at="start" if in_ranges else None, min_dim=1)
