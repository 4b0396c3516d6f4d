"""What the integrators' Warp kernels share (:mod:`~alchemi_integrators.warp_kernels`,
:mod:`~alchemi_integrators.langevin_blocks`): the half-kick, the idle-system test, the per-atom
Gaussian draws, and :func:`declare_overloads`, which types their generic arguments."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import warp as wp

#: Arguments that hold a vector per atom or system (``wp.vec3``), by name.
VECTOR_ARGS = frozenset({"x", "v", "f", "momentum", "sums", "dx", "dx_out", "kicks", "powers"})
#: Arguments that hold rows of scalars per system (``wp.array2d``), by name.
ARRAY2D_ARGS = frozenset({"xi", "vxi", "coeff"})


def declare_overloads(kernels: Iterable[Any]) -> None:
    """Declare each kernel for float32 and float64 together, so its module compiles once (and is
    cached by Warp) instead of once per dtype met at run time: a generic scalar becomes the
    precision, a generic array a vector array (:data:`VECTOR_ARGS`), a 2-D array
    (:data:`ARRAY2D_ARGS`) or an array of the precision."""
    kernels = list(kernels)
    for scalar, vector in ((wp.float32, wp.vec3f), (wp.float64, wp.vec3d)):
        for kernel in kernels:
            types: dict[str, Any] = {}
            for arg in kernel.adj.args:
                if arg.type is not Any and getattr(arg.type, "dtype", None) is not Any:
                    continue
                if arg.type is Any:
                    types[arg.label] = scalar
                elif arg.label in VECTOR_ARGS:
                    types[arg.label] = wp.array(dtype=vector)
                elif arg.label in ARRAY2D_ARGS:
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
def gaussian3(seed: wp.int32, system_id: wp.int64, step: wp.int32, local: wp.int32, like: Any):
    # Three N(0, 1) numbers keyed by (seed, system, its step, atom within it): the same numbers
    # for a system wherever it sits in the batch.
    state = wp.rand_init(seed, wp.int32(system_id))
    state = wp.rand_init(wp.int32(state), step)
    state = wp.rand_init(wp.int32(state), local)
    return type(like)(
        type(like[0])(wp.randn(state)), type(like[0])(wp.randn(state)), type(like[0])(wp.randn(state))
    )
