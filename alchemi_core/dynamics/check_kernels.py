"""A check's per-system reductions over atoms, as Warp kernels: the quarantine's failure codes
and each system's largest force norm.

:meth:`~alchemi_core.dynamics.quarantine.HealthCheck.codes` runs at every check; in torch it is
some thirty small operations, each a kernel launch and a trip through the dispatcher, which
costs more host time than the work. Here one kernel resets the per-system accumulators, one
thread per atom tests its position, velocity and force and widens its system's bounding box
(reading before it writes, so most threads leave the shared rows alone), and one thread per
system turns the flags, its energy and its box into the code. The result is the torch version's,
bit for bit (a test holds them equal). :func:`force_max_kernel` measures ``fmax`` by runs of
:data:`WIDTH` atoms (:mod:`~alchemi_core.dynamics.force_max`).

Warp is not a dependency of alchemi-core: importing this module does not import it, and
:func:`kernels` and :func:`force_max_kernel` build theirs on first use. The launches are in
:func:`alchemi_core.dynamics.quarantine.warp_codes` and
:func:`alchemi_core.dynamics.force_max.system_force_max`, which fall back to torch without
warp-lang. (Warp's kernel annotations are its own language: mypy skips this module.)
"""

from __future__ import annotations

import functools
from typing import Any

#: Consecutive atoms per thread of :func:`force_max_kernel`.
WIDTH = 16


def warp_for(device: Any) -> Any:
    """Warp, where this module's kernels can run on ``device`` (a torch device); None where they
    cannot (no warp-lang, or a build without its CPU compiler, as on the GPU test host) and the
    caller must use torch."""
    try:
        from alchemi_core.warp_runtime import can_launch, warp

        return warp() if can_launch(device) else None
    except ImportError:
        return None


@functools.cache
def _finite3() -> Any:
    """A Warp function: whether all three components of a vector are finite (both kernels)."""
    from alchemi_core.warp_runtime import warp

    wp = warp()

    @wp.func
    def finite3(v: Any):
        return wp.isfinite(v[0]) and wp.isfinite(v[1]) and wp.isfinite(v[2])

    return finite3


@functools.cache
def kernels() -> Any:
    """Build the kernels on first use (importing this module does not import Warp)."""
    from alchemi_core.warp_runtime import warp

    wp = warp()
    finite3 = _finite3()

    @wp.kernel
    def reset(bad: wp.array2d(dtype=wp.int32), lo: wp.array2d(dtype=wp.float64),
              hi: wp.array2d(dtype=wp.float64), big: wp.float64):
        s = wp.tid()
        for c in range(3):
            bad[s, c] = 0
            lo[s, c] = big
            hi[s, c] = -big

    @wp.kernel
    def atoms(positions: wp.array(dtype=Any), velocities: wp.array(dtype=Any), forces: wp.array(dtype=Any),
              has_velocities: int, has_forces: int, system: wp.array(dtype=wp.int64),
              bad: wp.array2d(dtype=wp.int32), lo: wp.array2d(dtype=wp.float64), hi: wp.array2d(dtype=wp.float64)):
        t = wp.tid()
        s = int(system[t])
        p = positions[t]
        if not finite3(p):
            bad[s, 0] = 1  # every writer stores the same value
        if has_velocities != 0:
            if not finite3(velocities[t]):
                bad[s, 1] = 1
        if has_forces != 0:
            if not finite3(forces[t]):
                bad[s, 2] = 1
        for c in range(3):
            x = wp.float64(p[c])
            # Read before writing: once the box is nearly known, few threads touch the shared row.
            if x < lo[s, c]:
                wp.atomic_min(lo, s, c, x)
            if x > hi[s, c]:
                wp.atomic_max(hi, s, c, x)

    @wp.kernel
    def systems(bad: wp.array2d(dtype=wp.int32), lo: wp.array2d(dtype=wp.float64), hi: wp.array2d(dtype=wp.float64),
                energy: wp.array(dtype=Any), has_energy: int, max_extent: wp.float64, out: wp.array(dtype=wp.int64)):
        s = wp.tid()
        code = wp.int64(0)
        if bad[s, 0] != 0:
            code = code + wp.int64(1)
        if bad[s, 1] != 0:
            code = code + wp.int64(2)
        if bad[s, 2] != 0:
            code = code + wp.int64(4)
        if has_energy != 0:
            if not wp.isfinite(energy[s]):
                code = code + wp.int64(8)
        extent = wp.float64(0.0)
        for c in range(3):
            extent = wp.max(extent, hi[s, c] - lo[s, c])
        # Only systems whose positions are all finite get the extent bit: for the others the
        # positions bit says what is wrong.
        if bad[s, 0] == 0 and extent > max_extent:
            code = code + wp.int64(16)
        out[s] = code

    for vec, scalar in ((wp.vec3f, wp.float32), (wp.vec3d, wp.float64)):
        arr = wp.array(dtype=vec)
        wp.overload(atoms, {"positions": arr, "velocities": arr, "forces": arr})
        wp.overload(systems, {"energy": wp.array(dtype=scalar)})
    return reset, atoms, systems


@functools.cache
def force_max_kernel() -> Any:
    """Each system's largest force norm into ``out`` (zeroed first), by runs as the atoms kernel
    (built on first use); a non-finite force counts as ``inf``."""
    from alchemi_core.warp_runtime import warp

    wp = warp()
    _WIDTH = wp.constant(WIDTH)
    finite3 = _finite3()

    @wp.func
    def raise_to(out: wp.array(dtype=Any), s: int, m: Any):
        if m > out[s]:  # read before written: most runs find their system's value already higher
            wp.atomic_max(out, s, m)

    @wp.kernel
    def force_max(forces: wp.array(dtype=Any), system: wp.array(dtype=wp.int64), count: int,
                  out: wp.array(dtype=Any)):
        first = wp.tid() * _WIDTH
        s = int(system[first])
        m = out.dtype(0.0)
        for q in range(_WIDTH):
            t = first + q
            if t < count:
                u = int(system[t])
                if u != s:  # a new run: the last one goes to its system
                    raise_to(out, s, m)
                    s = u
                    m = out.dtype(0.0)
                f = forces[t]
                n = wp.length(f)
                if not finite3(f):
                    n = out.dtype(wp.inf)
                m = wp.max(m, n)
        raise_to(out, s, m)

    for vec, scalar in ((wp.vec3f, wp.float32), (wp.vec3d, wp.float64)):
        wp.overload(force_max, {"forces": wp.array(dtype=vec), "out": wp.array(dtype=scalar)})
    return force_max
