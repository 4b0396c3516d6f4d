"""Langevin's B-A-O step with the centre of mass held, for batches of small systems: one block of
GPU threads per system, in one launch (:func:`launch`).

The general path (:mod:`~alchemi_integrators.warp_kernels`) takes four launches: B-A-O writing
each atom's noise momentum, a zeroing of the systems' totals, their per-system sums
(:mod:`~alchemi_integrators.system_sums`) and the correction with the second A. Here a block of
:data:`BLOCK` threads steps one system's atoms, adds their noise momenta in shared memory (a
Warp tile) and corrects its own atoms: the same arithmetic, no per-atom buffer, one launch. A
system of ``n`` atoms keeps ``n / BLOCK`` atoms per thread, so this pays only while systems are
small (:data:`UP_TO`); one system of millions of atoms stays on the general path.

Warp's tiles changed shape between releases (a per-thread value became a one-dimensional tile in
later ones), so this kernel is used only with a warp-lang at least :data:`SINCE`; older ones take
the general path. Its module is compiled only when launched.

Example:
    >>> fits(torch.device("cuda"), 256) == (WARP_VERSION >= SINCE), fits(torch.device("cuda"), 10**6)
    (True, False)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import warp as wp

from alchemi_integrators.kernel_funcs import declare_overloads, gaussian3, half_kick, idle

if TYPE_CHECKING:
    from alchemi_core.data import Batch
    from alchemi_core.warp_runtime import RecordedLaunches

#: Threads per block on a GPU (Warp's default block size, which its tiles are compiled for).
BLOCK = 256
#: Largest system (atoms) stepped by one block.
UP_TO = 4 * BLOCK
#: The oldest warp-lang this kernel was built and run with.
SINCE = (1, 19)
#: Whether the step takes this path, by device type. A CPU's tiles are one thread wide, so there
#: it is one thread per system in one launch, where the general path runs in ranges on every
#: core (and the CPU's default Langevin is torch's anyway); tests turn it on there.
BY_DEVICE = {"cuda": True, "cpu": False}
WARP_VERSION = tuple(int(part) for part in wp.config.version.split(".")[:2])


@wp.kernel
def _langevin_baoa_block(
    x: wp.array(dtype=Any),
    v: wp.array(dtype=Any),
    f: wp.array(dtype=Any),
    inv_mass: wp.array(dtype=Any),
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
    stride: int,
):
    # B, A, O, the centre-of-mass correction and the second A of BAOAB for one system per block
    # of threads (launched over [systems, stride]): each thread steps atoms lane, lane + stride,
    # ... of its system, the block sums their noise momentum (a tile, in shared memory on a GPU),
    # and each thread takes the system's COM velocity out of its own atoms. The same numbers as
    # _langevin_baoa + system_sums + _langevin_remove_com_drift, but one launch and no per-atom
    # kicks buffer. A CPU's tiles are one thread wide: stride 1 there, one thread per system.
    b, lane = wp.tid()
    if idle(active, b):
        return  # the whole block: its threads share the system
    lo = first_atom[b]
    hi = first_atom[b + 1]
    h = type(kb)(0.5) * dt[b]
    c1 = wp.exp(-friction[b] * dt[b])
    fluctuation = (type(kb)(1.0) - c1 * c1) * kb * temperature[b]
    p = type(v[0])()
    i = lo + wp.int64(lane)
    while i < hi:
        im = inv_mass[i]
        vi = half_kick(v[i], f[i], im, dt[b])
        noise = gaussian3(seed, system_id[b], noise_step[b], wp.int32(i - lo), vi) * wp.sqrt(fluctuation * im)
        v[i] = vi * c1 + noise
        x[i] = x[i] + vi * h
        p = p + noise * mass[i]
        i = i + wp.int64(stride)
    drift = wp.tile_extract(wp.tile_sum(wp.tile(p, preserve_type=True)), 0) / total_mass[b]
    i = lo + wp.int64(lane)
    while i < hi:
        vi = v[i] - drift
        v[i] = vi
        x[i] = x[i] + vi * h
        i = i + wp.int64(stride)


def fits(device: torch.device, largest: int) -> bool:
    """Whether a batch whose largest system has ``largest`` atoms takes the one-launch step on
    ``device``."""
    return BY_DEVICE.get(device.type, False) and WARP_VERSION >= SINCE and 0 < largest <= UP_TO


def launch(launches: RecordedLaunches, batch: Batch, args: tuple[Any, ...]) -> None:
    """Step every system of ``batch``: ``args`` are the kernel's arguments up to ``seed``."""
    stride = BLOCK if batch.device.type == "cuda" else 1
    launches.launch("baoa_block", _langevin_baoa_block, (batch.num_graphs, stride), (*args, stride), batch.device)


if WARP_VERSION >= SINCE:  # an older Warp would fail to build the tiles
    declare_overloads([_langevin_baoa_block])
