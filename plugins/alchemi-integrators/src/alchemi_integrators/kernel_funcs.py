"""What the integrators' Warp kernels share (:mod:`~alchemi_integrators.warp_kernels`,
:mod:`~alchemi_integrators.npt_common`): the half-kick, the idle-system test, the per-atom
Gaussian draws, the gamma and chi-squared draws and the factor of stochastic velocity rescaling, a
Nose-Hoover chain's half step, :func:`declare_overloads`, which types their
generic arguments, and :class:`Launches`, which passes tensors to them by argument name."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import warp as wp

from alchemi_core.warp_runtime import RecordedLaunches, warp

#: Rejection rounds of the gamma sampler at most (each accepts with probability above 0.95).
GAMMA_TRIES = 64
_GAMMA_TRIES = wp.constant(GAMMA_TRIES)

#: Arguments that hold a vector per atom or system (``wp.vec3``), by name.
VECTOR_ARGS = frozenset({"x", "v", "f", "momentum", "sums", "dx", "dx_out", "kicks", "powers", "values", "partial",
                         "totals", "diag", "off", "kd", "ko", "tangent", "f_out", "wrap"})
#: Arguments that hold rows of scalars per system (``wp.array2d``), by name.
ARRAY2D_ARGS = frozenset({"xi", "vxi", "coeff", "bxi", "bvxi"})
#: Arguments that hold a 3x3 matrix per system (``wp.mat33``), by name.
MATRIX_ARGS = frozenset({"g", "cell", "stress", "kick", "push", "grow", "carry", "shrink", "inv_cell"})


class Launches(RecordedLaunches):
    """Core's recorded launches, with this package's ``[N, 3]`` arguments (:data:`VECTOR_ARGS`) as
    vec3 arrays and ``[B, 3, 3]`` ones (:data:`MATRIX_ARGS`) as mat33 arrays.

    Example:
        >>> launches = Launches()
    """

    def __init__(self) -> None:
        super().__init__(vector_args=VECTOR_ARGS)

    def _to_warp(self, label: str, value: Any) -> Any:
        if label in MATRIX_ARGS and isinstance(value, torch.Tensor):
            dtype = {torch.float32: wp.mat33f, torch.float64: wp.mat33d}[value.dtype]
            return warp().from_torch(value, dtype=dtype)
        return super()._to_warp(label, value)


def launches_of(dyn: Any) -> Launches:
    """The integrator's recorded launches (made on first use)."""
    recorded = getattr(dyn, "_warp_launches", None)
    if recorded is None:
        recorded = dyn._warp_launches = Launches()
    return recorded


def declare_overloads(
    kernels: Iterable[Any], vectors: frozenset[str] = VECTOR_ARGS, rows: frozenset[str] = ARRAY2D_ARGS,
    matrices: frozenset[str] = MATRIX_ARGS,
) -> None:
    """Declare each kernel for float32 and float64 together, so its module compiles once (and is
    cached by Warp) instead of once per dtype met at run time: a generic scalar becomes the
    precision, a generic array a vector array (named in ``vectors``), a 2-D array (``rows``), a
    3x3 matrix array (``matrices``) or an array of the precision."""
    kernels = list(kernels)
    for scalar, vector, matrix in ((wp.float32, wp.vec3f, wp.mat33f), (wp.float64, wp.vec3d, wp.mat33d)):
        for kernel in kernels:
            types: dict[str, Any] = {}
            for arg in kernel.adj.args:
                if arg.type is not Any and getattr(arg.type, "dtype", None) is not Any:
                    continue
                if arg.type is Any:
                    types[arg.label] = scalar
                elif arg.label in matrices:
                    types[arg.label] = wp.array(dtype=matrix)
                elif arg.label in vectors:
                    types[arg.label] = wp.array(dtype=vector)
                elif arg.label in rows:
                    types[arg.label] = wp.array2d(dtype=scalar)
                else:
                    types[arg.label] = wp.array(dtype=scalar)
            wp.overload(kernel, types)


@wp.func
def half_kick(v: Any, f: Any, inv_mass: Any, dt: Any):
    # v + dt/2 F/m (inv_mass = ACCELERATION / m turns eV/Å into Å/fs²).
    return v + f * (type(dt)(0.5) * dt * inv_mass)


@wp.func
def idle(active: wp.array(dtype=Any), b: Any):
    # Systems of other stages (or graduated ones): the kernel leaves them untouched.
    return active[b] == type(active[b])(0.0)


@wp.func
def kick_atom(v: wp.array(dtype=Any), f: wp.array(dtype=Any), inv_mass: wp.array(dtype=Any), dt: wp.array(dtype=Any),
              active: wp.array(dtype=Any), i: Any, b: Any):
    # Atom i's half-kick (stored) unless its system b is idle; its velocity either way.
    vi = v[i]
    if not idle(active, b):
        vi = half_kick(vi, f[i], inv_mass[i], dt[b])
        v[i] = vi
    return vi


@wp.func
def keyed_state(seed: wp.int32, first: wp.int32, second: wp.int32):
    # A generator state keyed by the seed and two integers (Warp's rand_init, chained): the
    # counter-based draws' common recipe; a third key chains on the same way.
    state = wp.rand_init(seed, first)
    return wp.rand_init(wp.int32(state), second)


@wp.func
def system_stream(seed: wp.int32, system_id: wp.int64, step: wp.int32, local: wp.int32):
    # A generator state keyed by (seed, system, its step count, a number within the system: an
    # atom, or a purpose): the same numbers for a system wherever it sits in the batch.
    return wp.rand_init(wp.int32(keyed_state(seed, wp.int32(system_id), step)), local)


@wp.func
def gaussian3(seed: wp.int32, system_id: wp.int64, step: wp.int32, local: wp.int32, like: Any):
    # Three N(0, 1) numbers keyed by (seed, system, its step, atom within it).
    state = system_stream(seed, system_id, step, local)
    return type(like)(
        type(like[0])(wp.randn(state)), type(like[0])(wp.randn(state)), type(like[0])(wp.randn(state))
    )


@wp.func
def _marsaglia_tsang(state: wp.uint32, shape: Any):
    # A Gamma(shape, 1) number for shape >= 1 (Marsaglia & Tsang, ACM TOMS 26, 363 (2000)).
    one = type(shape)(1.0)
    d = shape - one / type(shape)(3.0)
    c = one / wp.sqrt(type(shape)(9.0) * d)
    out = d  # the mode, should every round be rejected
    tries = int(0)  # noqa: UP018 - a Warp variable the loop changes (a bare 0 is a constant)
    while tries < _GAMMA_TRIES:
        tries += 1
        x = type(shape)(wp.randn(state))
        t = one + c * x
        u = type(shape)(wp.randf(state))
        if t > type(shape)(0.0):
            v = t * t * t
            if wp.log(u) < type(shape)(0.5) * x * x + d - d * v + d * wp.log(v):
                out = d * v
                tries = _GAMMA_TRIES
    return out


@wp.func
def gamma_variate(state: wp.uint32, shape: Any):
    """A Gamma(shape, 1) number for ``shape > 0``: Marsaglia & Tsang's rejection method for
    ``shape >= 1``; below 1 their boost, a Gamma(shape + 1) number times ``U^(1/shape)``."""
    one = type(shape)(1.0)
    u = type(shape)(wp.randf(state))  # drawn first: the rejection rounds' numbers follow it
    if shape < one:
        return _marsaglia_tsang(state, shape + one) * wp.pow(u, one / shape)
    return _marsaglia_tsang(state, shape)


@wp.func
def sum_of_squared_normals(state: wp.uint32, first: Any, count: Any):
    # first² plus chi-squared(count - 1) (twice a Gamma((count - 1) / 2) number): the sum of
    # ``count`` squared N(0, 1) whose first is given, one draw whatever the count.
    rest = type(first)(0.0)
    if count > type(first)(1.5):
        rest = type(first)(2.0) * gamma_variate(state, type(first)(0.5) * (count - type(first)(1.0)))
    return first * first + rest


@wp.func
def rescaling_factor(ke: Any, target: Any, nf: Any, c: Any, r1: Any, chi2: Any):
    # Stochastic velocity rescaling (Bussi, Donadio & Parrinello, J. Chem. Phys. 126, 014101
    # (2007), their appendix): the factor that takes kinetic energy ke of nf degrees of freedom to
    # an exact sample of its canonical relaxation towards target = nf kT / 2 over a time with
    # c = exp(-time / tau); r1 is the first normal, chi2 the sum of the squares of all nf.
    one = type(ke)(1.0)
    zero = type(ke)(0.0)
    if ke <= zero:
        return one
    new_ke = c * ke + (one - c) * target * chi2 / nf + type(ke)(2.0) * r1 * wp.sqrt(c * (one - c) * ke * target / nf)
    alpha = wp.sqrt(wp.max(new_ke, zero) / ke)
    if c < one and r1 + wp.sqrt(c * nf * ke / ((one - c) * target)) < zero:
        alpha = -alpha
    return alpha


@wp.func
def _chain_force(
    j: wp.int32, ke: Any, nf: Any, kt: Any, q_first: Any, q_rest: Any, vxi: wp.array2d(dtype=Any), b: wp.int32
):
    if j == 0:
        return (type(ke)(2.0) * ke - nf * kt) / q_first
    q_below = q_rest
    if j == 1:
        q_below = q_first
    return (q_below * vxi[b, j - 1] * vxi[b, j - 1] - kt) / q_rest


@wp.func
def _chain_kick(
    j: wp.int32, h: Any, ke: Any, nf: Any, kt: Any, q_first: Any, q_rest: Any, vxi: wp.array2d(dtype=Any), b: wp.int32
):
    g = _chain_force(j, ke, nf, kt, q_first, q_rest, vxi, b)
    if j + 1 < vxi.shape[1]:
        damp = wp.exp(-type(h)(0.25) * h * vxi[b, j + 1])
        vxi[b, j] = (vxi[b, j] * damp + type(h)(0.5) * h * g) * damp
    else:
        vxi[b, j] = vxi[b, j] + type(h)(0.5) * h * g


@wp.func
def chain_walk(
    b: wp.int32,
    ke: Any,
    xi: wp.array2d(dtype=Any),
    vxi: wp.array2d(dtype=Any),
    kt: Any,
    tau: Any,
    nf: Any,
    dt: Any,
    weights: wp.array(dtype=Any),
    chain_steps: wp.int32,
):
    # System b's Nose-Hoover chain (row b of xi, vxi) over dt/2, driven by kinetic energy ke of
    # nf degrees of freedom; masses Q_1 = nf kT tau², Q_j = kT tau² (the scheme of
    # nose_hoover.nhc_half_step). Returns the factor the chain scales the velocities by.
    m = xi.shape[1]
    q_rest = kt * tau * tau
    q_first = nf * q_rest
    k = ke
    total = type(ke)(1.0)
    for c in range(chain_steps):  # noqa: B007 - a Warp kernel's loop: the count is what matters
        for w in range(weights.shape[0]):
            h = type(ke)(0.5) * dt * weights[w] / type(ke)(chain_steps)
            for jj in range(m):
                _chain_kick(m - 1 - jj, h, k, nf, kt, q_first, q_rest, vxi, b)
            s = wp.exp(-h * vxi[b, 0])
            total = total * s
            k = k * s * s
            for j in range(m):
                xi[b, j] = xi[b, j] + h * vxi[b, j]
            for j in range(m):
                _chain_kick(j, h, k, nf, kt, q_first, q_rest, vxi, b)
    return total
