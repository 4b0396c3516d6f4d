"""What the integrators' Warp kernels share (:mod:`~alchemi_integrators.warp_kernels`,
:mod:`~alchemi_integrators.npt_common`): the half-kick, the idle-system test, the per-atom
Gaussian draws, a Nose-Hoover chain's half step, :func:`declare_overloads`, which types their
generic arguments, and :class:`Launches`, which passes tensors to them by argument name."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import warp as wp

from alchemi_core.warp_runtime import RecordedLaunches, warp

#: Arguments that hold a vector per atom or system (``wp.vec3``), by name.
VECTOR_ARGS = frozenset({"x", "v", "f", "momentum", "sums", "dx", "dx_out", "kicks", "powers", "values", "partial",
                         "totals", "diag", "off", "kd", "ko"})
#: Arguments that hold rows of scalars per system (``wp.array2d``), by name.
ARRAY2D_ARGS = frozenset({"xi", "vxi", "coeff", "bxi", "bvxi"})
#: Arguments that hold a 3x3 matrix per system (``wp.mat33``), by name.
MATRIX_ARGS = frozenset({"g", "cell", "stress", "kick", "push", "grow", "carry", "shrink"})


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
def keyed_state(seed: wp.int32, first: wp.int32, second: wp.int32):
    # A generator state keyed by the seed and two integers (Warp's rand_init, chained): the
    # counter-based draws' common recipe; a third key chains on the same way.
    state = wp.rand_init(seed, first)
    return wp.rand_init(wp.int32(state), second)


@wp.func
def gaussian3(seed: wp.int32, system_id: wp.int64, step: wp.int32, local: wp.int32, like: Any):
    # Three N(0, 1) numbers keyed by (seed, system, its step, atom within it): the same numbers
    # for a system wherever it sits in the batch.
    state = wp.rand_init(wp.int32(keyed_state(seed, wp.int32(system_id), step)), local)
    return type(like)(
        type(like[0])(wp.randn(state)), type(like[0])(wp.randn(state)), type(like[0])(wp.randn(state))
    )


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
