"""Recorded Warp launches made from an earlier recording of the same kernel, re-pointed.

``wp.launch(..., record_cmd=True)`` resolves a generic kernel's overload from its arguments,
loads its module and packs every argument: on this workplace's 2-core CPU about 70 µs a launch
with warp-lang 1.19, 30 of them (2.0-2.1 ms) each time a FIRE run of 256 cells prepares its
neighbour list, forces and steps, all again for the next run or the next set of systems. A
launch of a kernel overload that was recorded before only needs its arguments packed:
:func:`record` copies that earlier recording (its module, kernel hooks and launch settings) and
sets each argument and the launch size in the copy. Every argument is packed with Warp's own checks (``set_param_at_index``), so
a wrong type still raises.

Which device types do this is :data:`REUSE`; elsewhere :func:`record` is ``wp.launch``.

Example:
    >>> from alchemi_core import warp_recordings
    >>> warp_recordings.REUSE["cpu"]
    True
"""

from __future__ import annotations

import copy
import ctypes
from collections.abc import Sequence
from typing import Any

#: Whether a launch is recorded from an earlier recording of the same kernel overload, by Warp
#: device type. On for CPUs (every CPU test runs through it). Off for CUDA: its GPU tests pass on an
#: H100, but W2 and W3 measured the same with it there (``docs/performance.md``) and the full GPU
#: suite has not run with it on; ``--variant "alchemi_core.warp_recordings:REUSE[cuda]=True"``.
REUSE = {"cpu": True, "cuda": False}

#: (kernel, device, argument types) -> an earlier recording with no arguments of its own kept.
_recordings: dict[tuple[Any, ...], Any] = {}
#: Recordings kept at most (all are dropped past it): a process launches a few dozen overloads;
#: more means kernels made anew for every launch, whose recordings would only pile up (each keeps
#: the compiled module it was recorded from loaded).
MAX_KEPT = 256


def record(wp: Any, kernel: Any, dim: int | Sequence[int], inputs: Sequence[Any], device: Any) -> Any:
    """A recorded launch of ``kernel`` over ``dim`` threads with ``inputs`` on Warp ``device``
    (None where Warp could not prepare the kernel, as ``wp.launch`` returns)."""
    key = None
    if REUSE.get("cpu" if device.is_cpu else "cuda", False):
        key = (kernel, device.alias, *(_kind(a) for a in inputs))
        earlier = _recordings.get(key)
        if earlier is not None:
            return _repointed(earlier, inputs, dim)
    cmd = wp.launch(kernel, dim=dim, inputs=list(inputs), device=device, record_cmd=True)
    if key is not None and type(cmd) is wp.Launch:  # not a subclass with state of its own
        if len(_recordings) >= MAX_KEPT:
            _recordings.clear()
        _recordings[key] = _without_arguments(cmd)
    return cmd


def forget() -> None:
    """Drop every kept recording (the next launch of each kernel is recorded by Warp again)."""
    _recordings.clear()


def _kind(value: Any) -> Any:
    """What selects a generic kernel's overload: an array's type, dtype and dimensions, a Warp
    struct's definition (Warp 1.5 makes a class for every struct instance), or a value's type."""
    struct = getattr(value, "_cls", None)
    if struct is not None:
        return struct
    dtype = getattr(value, "dtype", None)
    ndim = getattr(value, "ndim", None)
    if dtype is not None and ndim is not None:
        return (type(value), dtype, ndim)
    return type(value)


def _copy(cmd: Any, fwd_args: list[Any]) -> Any:
    """A copy of ``cmd`` with a parameter list of its own (its slots still ``cmd``'s values) and,
    where Warp keeps the arguments themselves (1.19, for CPU graph capture), ``fwd_args``."""
    out = copy.copy(cmd)
    out.params = list(cmd.params)
    if getattr(cmd, "fwd_args", None) is not None:
        out.fwd_args = fwd_args
    return out


def _without_arguments(cmd: Any) -> Any:
    """A copy of ``cmd`` that keeps its kernel, module and settings but no reference to its
    arrays."""
    return _copy(cmd, [])


def _repointed(earlier: Any, inputs: Sequence[Any], dim: int | Sequence[int]) -> Any:
    """A new launch like ``earlier`` with ``inputs`` and ``dim``: each parameter slot gets a new
    packed value, so nothing is shared with ``earlier`` or the launches made from it."""
    cmd = _copy(earlier, list(inputs))
    if earlier.params_addr is not None:  # CUDA: the kernel reads its parameters through these
        cmd.params_addr = (ctypes.c_void_p * len(earlier.params_addr))()
    for index, value in enumerate(inputs):
        cmd.set_param_at_index(index, value)
    cmd.set_dim(dim)
    return cmd
