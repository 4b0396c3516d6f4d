"""Warp functions shared by the integrators' kernels (:mod:`~alchemi_integrators.warp_kernels`,
:mod:`~alchemi_integrators.langevin_blocks`): the half-kick, the idle-system test and the
per-atom Gaussian draws."""

from __future__ import annotations

from typing import Any

import warp as wp


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
