"""Per-system sums of per-atom vec3 values, in levels of chunks (a specialised kernel: an atomic
add per atom into its system's total serialises on one address in a large system).

At each level a thread adds up ``WIDTH`` consecutive values (a system's atoms are contiguous) and
keeps the sum of its first run of equal system index as a partial tagged with that system; later
runs in the chunk go straight to their totals. The next level sums the partials the same way, and
the last adds every run to its total, so a system of ``n`` atoms receives about
``n / WIDTH**LEVELS`` atomic adds. :func:`levels_for` takes as few levels (launches) as leave each
system at most :data:`ADDS_PER_SYSTEM` adds. The levels change only the order of the adds. No host
synchronisation, scratch in a :class:`~alchemi_core.workspace.Workspace`: they replay in a
captured step.

Example:
    >>> import torch
    >>> from alchemi_core.workspace import Workspace
    >>> from alchemi_integrators.system_sums import system_sums
    >>> from alchemi_integrators.kernel_funcs import Launches
    >>> values = torch.ones(100, 3)
    >>> system = torch.repeat_interleave(torch.arange(3), torch.tensor([1, 60, 39]))
    >>> out = torch.zeros(3, 3)
    >>> system_sums(Launches(), Workspace(), "demo", values, system, out)
    >>> out[:, 0].tolist()
    [1.0, 60.0, 39.0]
"""

from __future__ import annotations

from typing import Any

import torch
import warp as wp

from alchemi_core.workspace import Workspace

#: Values per thread at every level: a constant, so the loop unrolls and a thread's loads are
#: all in flight at once.
WIDTH = 16
#: Levels of partial sums at most: a system of n atoms gets about n / WIDTH**LEVELS atomic adds
#: (256 for a million atoms).
LEVELS = 3
#: A batch whose systems are small takes fewer levels (each a launch): as few as leave every
#: system at most this many atomic adds into its total (one level up to WIDTH * ADDS atoms).
ADDS_PER_SYSTEM = 16

_WIDTH = wp.constant(WIDTH)


@wp.kernel
def _chunk_sums(
    values: wp.array(dtype=Any),
    system: wp.array(dtype=wp.int64),
    count: wp.int32,
    keep_first: wp.int32,
    partial: wp.array(dtype=Any),
    tag: wp.array(dtype=wp.int64),
    totals: wp.array(dtype=Any),
):
    # Sum values[k*WIDTH : (k+1)*WIDTH] by runs of equal system. With keep_first the first run
    # becomes partial[k] (tag[k] its system) and later runs are added to their totals; without
    # it every run is added to its total.
    k = wp.tid()
    lo = k * _WIDTH
    acc = values[lo]
    cur = system[lo]
    first = keep_first
    if system[wp.min(lo + _WIDTH, count) - 1] == cur:
        # The whole chunk is one system (indices do not decrease): the usual case, summed in the
        # same order as below but with no store or atomic add between the loads, which can then
        # all be in flight at once.
        for q in range(1, _WIDTH):
            i = lo + q
            if i < count:
                acc = acc + values[i]
    else:
        for q in range(1, _WIDTH):
            i = lo + q
            if i < count:
                b = system[i]
                if b == cur:
                    acc = acc + values[i]
                else:
                    if first != 0:
                        partial[k] = acc
                        tag[k] = cur
                        first = 0
                    else:
                        wp.atomic_add(totals, wp.int32(cur), acc)
                    acc = values[i]
                    cur = b
    if first != 0:
        partial[k] = acc
        tag[k] = cur
    else:
        wp.atomic_add(totals, wp.int32(cur), acc)


for _vector in (wp.vec3f, wp.vec3d):
    _arr = wp.array(dtype=_vector)
    wp.overload(_chunk_sums, {"values": _arr, "partial": _arr, "totals": _arr})


def _chunks(count: int) -> int:
    return (count + WIDTH - 1) // WIDTH


def levels_for(largest: int) -> int:
    """Levels of chunk sums for a batch whose largest system has ``largest`` atoms: the fewest
    that leave each system at most :data:`ADDS_PER_SYSTEM` atomic adds, at most :data:`LEVELS`.

    Example:
        >>> [levels_for(n) for n in (108, 256, 257, 4096, 65536, 1 << 20)]
        [1, 1, 2, 2, 3, 3]
    """
    levels = 1
    while levels < LEVELS and largest > ADDS_PER_SYSTEM * WIDTH**levels:
        levels += 1
    return levels


def system_sums(
    launches: Any, work: Workspace, name: str, values: torch.Tensor, system: torch.Tensor, totals: torch.Tensor,
    largest: int | None = None,
) -> None:
    """Add ``values`` (``[N, 3]``, atoms of a system contiguous) into ``totals`` (``[B, 3]``) by
    ``system`` (``[N]`` int64, non-decreasing); ``totals`` is not zeroed here.

    ``launches`` is a :class:`~alchemi_integrators.kernel_funcs.Launches`; ``work`` holds the
    partials under ``name``.
    ``largest``: the most atoms of one system (host-known, e.g. ``batch.num_nodes_per_system``),
    which sets the levels (:func:`levels_for`); None takes all :data:`LEVELS`.
    """
    n = int(values.shape[0])
    if n == 0:
        return
    levels = LEVELS if largest is None else levels_for(largest)
    device = values.device
    source, tags = values, system
    for level in range(levels):
        chunks = _chunks(n)
        last = level == levels - 1 or chunks == 1
        partial = work.get(f"{name}:partial{level}", chunks, chunks, (3,), values.dtype, device)
        tag = work.get(f"{name}:tag{level}", chunks, chunks, (), torch.int64, device)
        args = (source, tags, n, 0 if last else 1, partial, tag, totals)
        launches.launch(f"{name}:sums{level}", _chunk_sums, chunks, args, device)
        if last:
            return
        source, tags, n = partial, tag, chunks
