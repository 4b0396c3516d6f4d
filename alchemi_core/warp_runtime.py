"""The one Warp runtime every plugin shares: initialisation, torch's stream as a Warp stream, and
kernel launches recorded once and replayed.

Warp is imported on first use only (it is not a dependency of alchemi-core). Every launch goes
through here, on torch's current stream (ordered with the torch work around it, and captured with
it in a CUDA graph):

* :func:`stream_for`: torch's current stream as a Warp stream, wrapped once per torch stream.
* :class:`LaunchSequence`: launches recorded for fixed arrays and sizes, replayed in order.
* :class:`RecordedLaunches`: named launches replayed while their arguments stay the same objects.
* :func:`launch_args` (and :func:`launch_tensors`): one kernel, its recorded launch reused with
  new arguments (short kernels, where the host cost of a launch dominates).

Warp 1.5 (the oldest version supported) writes a float literal in a kernel as a float32
constant, even inside ``wp.float64(...)``: kernels therefore use only literals that float32
holds exactly (small integers, powers of two) and take other numbers as arguments.

Example:
    >>> import torch
    >>> from alchemi_core import warp_runtime
    >>> warp_runtime.stream_for(torch.device("cpu")) is None  # CPU launches need no stream
    True
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import torch

from alchemi_core.errors import AlchemiError, MissingDependencyError

_lock = threading.Lock()
_wp: Any = None
_streams: dict[tuple[int, int], Any] = {}
# Recorded single-kernel launches are mutated per call (new arguments), so each thread has its own.
_local = threading.local()
# Warp is not safe for launches from several threads at once: recording a launch can load a module
# that another thread's kernel is running from, and two CPU kernels running at once crashed the
# process (thread ranks of one process, ``InProcessBackend``). Launches take turns here; on a GPU
# the turn ends when the kernel is queued.
_launch_lock = threading.RLock()


class KernelLaunchError(AlchemiError, RuntimeError):
    """Warp could not prepare a kernel for a device (its module failed to build or load)."""


def warp() -> Any:
    """The ``warp`` module, initialised once (thread-safe).

    Raises:
        MissingDependencyError: warp-lang is not installed.
    """
    global _wp
    if _wp is not None:
        return _wp
    try:
        import warp as wp
    except ImportError:
        raise MissingDependencyError("this needs warp-lang: pip install 'warp-lang>=1.5'") from None
    with _lock:
        if _wp is None:
            wp.init()
            _wp = wp
    return _wp


def cuda_available() -> bool:
    """True when Warp can launch kernels on a CUDA device."""
    return bool(warp().is_cuda_available())


def warp_device(device: torch.device) -> Any:
    """The Warp device of a torch device (``cuda`` without an index: the current one)."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return warp().device_from_torch(device)


#: Warp devices by torch device: Warp's own lookup costs more than the rest of a view.
_devices: dict[tuple[str, int | None], Any] = {}
#: For each (torch dtype, Warp dtype or None) that ``from_torch`` accepted once: the Warp dtype
#: and its inner shape (``(3,)`` for a vector, ``()`` for a scalar).
_view_kinds: dict[tuple[torch.dtype, Any], tuple[Any, tuple[int, ...]]] = {}


def view(tensor: torch.Tensor, dtype: Any = None) -> Any:
    """A Warp array sharing ``tensor``'s memory (``dtype`` e.g. ``wp.vec3`` for ``[N, 3]``).

    The view ``wp.from_torch`` makes, built from the tensor's own pointer, shape and strides at a
    quarter of its host time. A pairing of dtypes is checked by ``from_torch`` the first time it is
    seen; tensors that need a gradient, 0-d tensors and trailing dimensions that do not fit
    ``dtype`` go through it every time (it wraps the gradient, or raises its own error).

    Example:
        >>> import torch
        >>> positions = torch.zeros(4, 3)
        >>> a = view(positions, warp().vec3f)
        >>> a.shape, a.ptr == positions.data_ptr()
        ((4,), True)
    """
    wp = warp()
    kind = _view_kinds.get((tensor.dtype, dtype))
    if kind is None or tensor.requires_grad or tensor.dim() == 0:
        made = wp.from_torch(tensor, dtype=dtype) if dtype is not None else wp.from_torch(tensor)
        _view_kinds.setdefault((tensor.dtype, dtype), (made.dtype, tuple(tensor.shape[made.ndim:])))
        return made
    wtype, inner = kind
    size = tensor.element_size()
    shape, strides = tuple(tensor.shape), tensor.stride()
    if inner:
        k = len(inner)
        contiguous = strides[-1] == 1 and (k == 1 or strides[-2] == inner[-1])
        if len(shape) < k or shape[-k:] != inner or not contiguous:
            return wp.from_torch(tensor, dtype=dtype)  # raises Warp's own error
        shape, strides = shape[:-k] or (1,), strides[:-k] or (1,)
    device = _devices.get((tensor.device.type, tensor.device.index))
    if device is None:
        device = _devices[(tensor.device.type, tensor.device.index)] = warp_device(tensor.device)
    # The deleter holds the tensor, so its memory lives as long as the view (as from_torch's does).
    return wp.array(ptr=tensor.data_ptr(), dtype=wtype, shape=shape, strides=tuple(s * size for s in strides),
                    device=device, copy=False, deleter=lambda ptr, size, held=tensor: None)


def can_launch(device: torch.device) -> bool:
    """Whether Warp kernels can run on ``device``: warp-lang is installed and, on a CPU, the build
    has its CPU compiler (the GPU test host's has not)."""
    try:
        wp = warp()
    except MissingDependencyError:
        return False
    return device.type != "cpu" or bool(wp.is_cpu_available())


def require_device(device: torch.device, who: str = "alchemi") -> None:
    """Raise a clear error where Warp cannot run kernels on ``device``.

    Raises:
        MissingDependencyError: A CPU device where this Warp build has no CPU compiler.
    """
    if not can_launch(device):
        warp()  # no warp-lang at all: its own install hint
        raise MissingDependencyError(
            f"{who}: this warp-lang build cannot run kernels on the CPU (it has no CPU "
            "compiler); move the batch to a CUDA device (batch.to('cuda')) or install the warp-lang "
            "wheel from PyPI, which includes the CPU backend"
        )


def stream_for(device: torch.device) -> Any:
    """Torch's current stream on ``device`` as a Warp stream (None on the CPU)."""
    if device.type != "cuda":
        return None
    current = torch.cuda.current_stream(device)
    key = (current.device_index, current.cuda_stream)
    stream = _streams.get(key)
    if stream is None:
        # The wrapper keeps its torch stream alive, so a cached handle is never reused by another.
        with _lock:
            if len(_streams) >= 32:  # runs use a handful of streams; the oldest goes first
                del _streams[next(iter(_streams))]
            stream = _streams[key] = warp().stream_from_torch(current)
    return stream


def _threads(dim: int | Sequence[int]) -> int:
    return math.prod(dim) if isinstance(dim, Sequence) else int(dim)


class LaunchSequence:
    """Kernel launches recorded once (``wp.launch(..., record_cmd=True)``) and replayed in order,
    which skips Warp's per-call argument packing. A sequence is recorded for fixed arrays and
    sizes; build a new one when they change.

    Args:
        device: The Warp device the kernels run on.
        who: The component named in errors (e.g. ``"alchemi-potentials"``).

    Example:
        >>> seq = LaunchSequence(device)  # doctest: +SKIP
        >>> seq.add(kernel, dim=n, inputs=[a, b])  # doctest: +SKIP
        >>> seq.run(stream_for(torch_device))  # doctest: +SKIP
    """

    def __init__(self, device: Any, who: str = "alchemi") -> None:
        self.device = warp().get_device(device)
        self.who = who
        self._commands: list[Any] = []

    def add(self, kernel: Any, dim: int | Sequence[int], inputs: Sequence[Any]) -> None:
        """Record one launch (nothing runs); a launch over zero threads is dropped.

        Raises:
            KernelLaunchError: Warp returned no launch: the kernel's module could not be built
                or loaded for this device (the first attempt raised the cause).
        """
        if _threads(dim) <= 0:
            return  # Warp records nothing for an empty grid (it returns None)
        with _launch_lock:
            cmd = warp().launch(kernel, dim=dim, inputs=inputs, device=self.device, record_cmd=True)
        if cmd is None:
            raise KernelLaunchError(
                f"{self.who}: Warp could not prepare kernel {kernel.key!r} for device {self.device}: "
                "building or loading its module failed earlier (see the first error; on a CPU device "
                "Warp needs its CPU compiler, on a GPU a working CUDA driver)"
            )
        self._commands.append(cmd)

    def run(self, stream: Any = None) -> None:
        """Launch every recorded kernel, in order, on ``stream`` (the device's default if None)."""
        with _launch_lock:
            for cmd in self._commands:
                cmd.launch(stream)

    def __len__(self) -> int:
        return len(self._commands)


class RecordedLaunches:
    """Named launches, each recorded once and replayed while its arguments stay the same objects.

    Arguments are torch tensors (zero-copy; one named in ``vector_args`` becomes a vec3 array),
    Python ints, or ``(value, torch dtype)`` pairs for float scalars of the batch's precision. The
    recorded launch holds its tensors, so an object cannot be freed and its id reused meanwhile.

    Args:
        vector_args: Kernel argument names that take ``[N, 3]`` tensors as vec3 arrays.
    """

    def __init__(self, vector_args: frozenset[str] = frozenset()) -> None:
        self.vector_args = vector_args
        self._recorded: dict[str, tuple[int | tuple[int, ...], tuple[Any, ...], LaunchSequence]] = {}

    def launch(self, name: str, kernel: Any, dim: int | tuple[int, ...], args: Sequence[Any],
               device: torch.device) -> None:
        """Launch ``kernel`` over ``dim`` threads (a grid with a tuple) on torch's current stream
        of ``device``."""
        if _threads(dim) == 0:
            return
        stream = stream_for(device)
        hit = self._recorded.get(name)
        if hit is not None and hit[0] == dim and _same_args(hit[1], args):
            hit[2].run(stream)
            return
        labels = [arg.label for arg in kernel.adj.args]
        inputs = [self._to_warp(label, a) for label, a in zip(labels, args)]
        seq = LaunchSequence(warp_device(device))
        seq.add(kernel, dim, inputs)
        seq.run(stream)
        self._recorded[name] = (dim, tuple(args), seq)

    def _to_warp(self, label: str, value: Any) -> Any:
        wp = warp()
        if isinstance(value, torch.Tensor):
            vectors = {torch.float32: wp.vec3f, torch.float64: wp.vec3d}
            if value.dtype in vectors and label in self.vector_args:
                return wp.from_torch(value, dtype=vectors[value.dtype])
            return wp.from_torch(value)
        if isinstance(value, tuple):  # (python float, torch dtype): a typed scalar
            return {torch.float32: wp.float32, torch.float64: wp.float64}[value[1]](value[0])
        return value


def _same_args(held: tuple[Any, ...], args: Sequence[Any]) -> bool:
    for a, b in zip(held, args):
        if a is not b and (isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) or a != b):
            return False
    return len(held) == len(args)


class Typed:
    """A tensor argument of :func:`launch_args` viewed as Warp ``dtype`` (e.g. ``[N, 3]`` float32
    as ``wp.vec3f``)."""

    __slots__ = ("tensor", "dtype")

    def __init__(self, tensor: torch.Tensor, dtype: Any) -> None:
        self.tensor, self.dtype = tensor, dtype


def launch_tensors(kernel: Any, dim: Sequence[int], *args: torch.Tensor) -> None:
    """Launch ``kernel`` over ``dim`` threads with tensor ``args`` (zero-copy), on torch's stream
    of the first tensor's device: :func:`launch_args` with tensors only."""
    launch_args(kernel, dim, args, args[0].device)


def launch_args(kernel: Any, dim: int | Sequence[int], args: Sequence[Any], device: torch.device) -> None:
    """Launch ``kernel`` over ``dim`` threads on torch's current stream of ``device``.

    ``args`` are torch tensors (zero-copy, no gradient arrays), :class:`Typed` tensors, or plain
    values for scalar parameters. The first launch of a kernel overload on a device records a
    ``wp.Launch``; later launches only replace the arguments that changed and replay it (about
    ten times less host work than ``wp.launch``).
    """
    wp = warp()
    key = (kernel, device, *(_arg_kind(a) for a in args))
    launches = _local.__dict__.setdefault("launches", {})
    entry = launches.get(key)
    stream = stream_for(device)
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    bound = [_bound_as(a) for a in args]
    if entry is None:
        inputs = [_warp_arg(wp, a, as_ctype=False) for a in args]
        target = stream.device if stream is not None else "cpu"
        with _launch_lock:
            recorded = wp.launch(kernel, dim=dims, inputs=inputs, device=target, record_cmd=True)
        entry = launches[key] = [recorded, dims, bound]
    else:
        recorded, held = entry[0], entry[2]
        for i, a in enumerate(args):
            if held[i] == bound[i]:
                continue
            if isinstance(a, (torch.Tensor, Typed)):
                recorded.set_param_at_index_from_ctype(i, _warp_arg(wp, a, as_ctype=True))
            else:
                recorded.set_param_at_index(i, a)
        entry[2] = bound
        if entry[1] != dims:  # rebuilding the launch bounds costs as much as the launch
            recorded.set_dim(dims)
            entry[1] = dims
    with _launch_lock:
        entry[0].launch(stream)


def _bound_as(a: Any) -> Any:
    """What a launch argument binds: a tensor's memory and layout, or a scalar's type and value."""
    if isinstance(a, Typed):
        return (a.tensor.data_ptr(), a.tensor.shape, a.tensor.stride(), a.tensor.dtype, a.dtype)
    if isinstance(a, torch.Tensor):
        return (a.data_ptr(), a.shape, a.stride(), a.dtype)
    return (type(a), getattr(a, "value", a))


def _arg_kind(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return a.dtype
    if isinstance(a, Typed):
        return (a.tensor.dtype, a.dtype)
    return type(a)


def _warp_arg(wp: Any, a: Any, as_ctype: bool) -> Any:
    """A tensor (or :class:`Typed` tensor) as a Warp array, or as its descriptor with
    ``as_ctype``; anything else as it is."""
    if isinstance(a, torch.Tensor):
        return wp.from_torch(a, requires_grad=False, return_ctype=as_ctype)
    if isinstance(a, Typed):
        return wp.from_torch(a.tensor, dtype=a.dtype, requires_grad=False, return_ctype=as_ctype)
    return a
