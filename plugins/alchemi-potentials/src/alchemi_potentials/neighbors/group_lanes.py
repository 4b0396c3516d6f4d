"""Lanes of a GPU warp that work on one slot together: which of them found something, as bits.

A group is ``size`` consecutive threads (``size`` a power of two up to 16) of one warp, lane
``tid % size``; every lane of a group must call :func:`group_ballot` the same number of times (they
walk the same candidates, ``size`` at a time). The grouped neighbour search (:mod:`.search`) uses
it to write the candidates found in one round at consecutive entries, in candidate order, in one
pass.

On a CPU, where Warp runs a kernel's threads one after another, a group must be of one lane.

This module keeps Python's own annotations (no ``from __future__ import annotations``): Warp reads
the native functions' types from them.

Example:
    >>> group_ballot.key, popcount.key
    ('group_ballot', 'popcount')
"""

import warp as wp

_BALLOT = """
#if defined(__CUDA_ARCH__)
    const unsigned int width = (unsigned int)size;
    const unsigned int first = (threadIdx.x & 31u) & ~(width - 1u);
    const unsigned int mask = ((width == 32u) ? 0xffffffffu : ((1u << width) - 1u)) << first;
    return (int)((__ballot_sync(mask, hit != 0) >> first) & ((width == 32u) ? 0xffffffffu : ((1u << width) - 1u)));
#else
    return hit != 0 ? 1 : 0;
#endif
"""

_POPCOUNT = """
#if defined(__CUDA_ARCH__)
    return __popc((unsigned int)bits);
#else
    return __builtin_popcount((unsigned int)bits);
#endif
"""


@wp.func_native(_BALLOT)
def group_ballot(hit: int, size: int) -> int:
    """Bit ``l`` set where lane ``l`` of the caller's group has ``hit != 0``."""
    ...


@wp.func_native(_POPCOUNT)
def popcount(bits: int) -> int:
    """How many bits of ``bits`` are set."""
    ...
