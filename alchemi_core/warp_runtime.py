"""The one Warp runtime every plugin shares: initialisation, torch's stream as a Warp stream, and
kernel launches recorded once and replayed.

Warp is not a dependency of alchemi-core: this module imports it on first use only, so importing
``alchemi_core`` (or running ``alchemi list-plugins``) never loads Warp; a plugin that launches
kernels depends on ``warp-lang`` itself. Everything that launches Warp kernels in alchemi goes
through here, so every launch is on torch's current stream (ordered with the torch work around
it, and captured with it in a CUDA graph), with one cache of stream wrappers and one set of
replay rules:

* :func:`stream_for`: torch's current stream on a device as a Warp stream, wrapped once per
  torch stream (wrapping costs more than a launch).
* :class:`LaunchSequence`: launches recorded for fixed arrays and sizes and replayed in order
  (a model's forward); on a CPU a long kernel can be cut into :data:`CPU_CHUNKS` ranges that run
  on as many threads as torch uses (:meth:`LaunchSequence.add_chunked`). A kernel recorded
  before is recorded again from that recording (:mod:`alchemi_core.warp_recordings`).
* :class:`RecordedLaunches`: named launches replayed while their arguments stay the same
  objects (an integrator's updates).
* :func:`launch_args` (and :func:`launch_tensors`): one kernel on torch tensors and scalars, its
  recorded launch reused with new arguments (short kernels, where the host cost of a launch
  dominates: copies, the health checks).

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
import os
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from alchemi_core import cpu_executor, warp_recordings
from alchemi_core.errors import AlchemiError, MissingDependencyError

_lock = threading.Lock()
_wp: Any = None
_streams: dict[tuple[int, int], Any] = {}
#: Stream wrappers kept at most (oldest dropped first); runs use a handful of streams.
MAX_STREAMS = 32
# Recorded single-kernel launches are mutated per call (new arguments), so each thread has its own.
_local = threading.local()
#: How many ranges a chunked CPU kernel is cut into. Fixed, not the thread count, so that results
#: (sums over per-chunk buffers) are the same whatever the number of threads. Ranges of a kernel
#: without such buffers then merge into one per thread (``LaunchSequence.add_chunked``).
CPU_CHUNKS = 8
#: Below this many threads of work a CPU kernel runs as one launch (the split costs 100-200 us
#: on a 2-core virtual machine, ``python -m benchmarks.cpu_dispatch``).
MIN_CHUNKED_DIM = 4096
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _forget_pool() -> None:
    # A forked child has the pool object but none of its threads: it must start its own.
    global _pool, _pool_size
    _pool, _pool_size = None, 0


os.register_at_fork(after_in_child=_forget_pool)


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
#: For each (torch dtype, Warp dtype or None) that ``from_torch`` accepted once: the Warp dtype,
#: the bytes of its scalar and its inner shape (``(3,)`` for a vector, ``()`` for a scalar).
_view_kinds: dict[tuple[torch.dtype, Any], tuple[Any, int, tuple[int, ...]]] = {}


def view(tensor: torch.Tensor, dtype: Any = None) -> Any:
    """A Warp array sharing ``tensor``'s memory (``dtype`` e.g. ``wp.vec3`` for ``[N, 3]``).

    The view ``wp.from_torch`` makes (pointer, shape, strides, dtype, device), built from the
    tensor's own at a quarter of its host time (a run makes a hundred views, a model's first forward fifty).
    A pairing of dtypes is checked by ``from_torch`` the first time it is seen, and tensors that
    need a gradient, 0-d tensors and trailing dimensions that do not fit ``dtype`` go through it
    every time (it wraps the gradient, or raises its own error).

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
        _view_kinds.setdefault((tensor.dtype, dtype), (made.dtype, _scalar_bytes(made.dtype), _inner_shape(made.dtype)))
        return made
    wtype, size, inner = kind
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
    made = wp.array(ptr=tensor.data_ptr(), dtype=wtype, shape=shape, strides=tuple(s * size for s in strides),
                    device=device, copy=False)
    made._tensor = tensor  # as from_torch does: the memory lives as long as the view
    return made


def _scalar_bytes(dtype: Any) -> int:
    import ctypes

    return ctypes.sizeof(dtype._type_)


def _inner_shape(dtype: Any) -> tuple[int, ...]:
    return tuple(getattr(dtype, "_shape_", ()))


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
    """Torch's current stream on ``device`` as a Warp stream (None on the CPU).

    Launching there orders Warp kernels with the torch operations around them and lets a CUDA
    graph captured on that stream include them.
    """
    if device.type != "cuda":
        return None
    current = torch.cuda.current_stream(device)
    key = (current.device_index, current.cuda_stream)
    stream = _streams.get(key)
    if stream is None:
        # The wrapper keeps its torch stream alive, so a cached handle is never reused by another.
        with _lock:
            if len(_streams) >= MAX_STREAMS:
                del _streams[next(iter(_streams))]
            stream = _streams[key] = warp().stream_from_torch(current)
    return stream


def _threads(dim: int | Sequence[int]) -> int:
    return math.prod(dim) if isinstance(dim, Sequence) else int(dim)


def chunks_for(device: Any, dim: int, min_dim: int | None = None) -> int:
    """Into how many ranges :meth:`LaunchSequence.add_chunked` cuts a kernel of ``dim`` threads
    on ``device`` (a Warp or torch device): :data:`CPU_CHUNKS` for CPU kernels of at least
    ``min_dim`` threads (default :data:`MIN_CHUNKED_DIM`), else 1."""
    on_cpu = str(device).startswith("cpu")
    return CPU_CHUNKS if on_cpu and dim >= (MIN_CHUNKED_DIM if min_dim is None else min_dim) else 1


def cpu_workers() -> int:
    """Threads that run the chunks of a CPU kernel: torch's intra-op thread count (set it with
    ``torch.set_num_threads`` or ``OMP_NUM_THREADS``), at most :data:`CPU_CHUNKS`."""
    return max(1, min(CPU_CHUNKS, torch.get_num_threads()))


class Ranges(tuple):
    """The recorded launches of one CPU kernel's ranges (a tuple), and what runs them on the
    native executor once it has been prepared (:mod:`alchemi_core.cpu_executor`)."""

    prepared: Any = None  # None: not tried yet; False: the executor cannot run them


def _pool_for(workers: int) -> ThreadPoolExecutor:
    """The worker threads' pool, with at least ``workers - 1`` threads."""
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < workers - 1:
            _pool, _pool_size = ThreadPoolExecutor(max_workers=workers - 1, thread_name_prefix="alchemi-cpu"), workers - 1
        return _pool


def range_handoff() -> str:
    """How a CPU kernel's ranges reach the worker threads: ``"spinning"`` (the native executor, a
    few microseconds a kernel) or ``"sleeping"`` (the thread pool, 100-200 us on a 2-core virtual
    machine). A kernel short enough to run alone under the second pays ranges under the first, so
    thresholds for ranges are kept by these names."""
    return "spinning" if cpu_executor.runs_ranges(warp()) else "sleeping"


def _run_chunks(commands: Sequence[Any]) -> None:
    """Launch the chunks of one CPU kernel on the worker threads (Warp releases the GIL while a
    CPU kernel runs) and wait for all of them; the calling thread works too. Each thread takes
    the next chunk when it is done with one, so uneven chunks even out (where there are more
    chunks than threads: kernels with per-chunk buffers). Recorded ranges (:class:`Ranges`) go
    to the native executor where it can take them (:mod:`alchemi_core.cpu_executor`), the others
    to the thread pool."""
    workers = min(cpu_workers(), len(commands))
    if workers <= 1:
        _launch_all(commands)
        return
    if isinstance(commands, Ranges):
        if commands.prepared is None:
            commands.prepared = cpu_executor.prepare(warp(), commands, workers - 1) or False
        if commands.prepared and commands.prepared.run():
            return
    pool = _pool_for(workers)
    queue = iter(commands)  # shared: a list iterator hands each item out once, also across threads
    futures = [pool.submit(_launch_all, queue) for _ in range(workers - 1)]
    _launch_all(queue)
    for f in futures:
        f.result()


def _one_range_per_thread(bounds: Sequence[int], threads: int | None = None) -> list[int]:
    """The cuts ``bounds`` (``CPU_CHUNKS`` ranges, or cuts at system boundaries) merged into one
    range of consecutive ones per worker thread (``threads``, default :func:`cpu_workers`).

    Each range's launch is a call into Warp, and the calling thread then waits for the
    interpreter's lock; while the other thread holds it (its Python between launches) that wait
    sleeps, and waking a thread costs 100-200 us on a 2-core virtual machine
    (``python -m benchmarks.cpu_dispatch``). W6's step took 2.65-3.29 ms cut in 2 ranges against
    3.01-3.21 in 8 and 3.19-4.44 in 16 (five rounds each, ``CPU_CHUNKS``). Ranges of independent
    items can merge without changing a result; uneven work per item loses the next-range-when-done
    balancing, so the kernels cut this way spread theirs evenly (a listed neighbour search strides
    its rebuilding slots over the threads; the pair kernel's cuts fall near even shares of atoms).

    Example:
        >>> _one_range_per_thread([0, 2, 4, 6, 8], threads=2), _one_range_per_thread([0, 2, 4, 6, 8], threads=3)
        ([0, 4, 8], [0, 2, 4, 8])
    """
    n = len(bounds) - 1
    groups = min(cpu_workers() if threads is None else threads, n)
    return [bounds[g * n // groups] for g in range(groups)] + [bounds[n]]


def _launch_all(commands: Iterable[Any]) -> None:
    for cmd in commands:
        cmd.launch()


def _argument_index(kernel: Any, arg: int | str) -> int:
    """Position of ``kernel``'s parameter ``arg`` (a name, or already a position)."""
    if isinstance(arg, int):
        return arg
    labels = [a.label for a in kernel.adj.args]
    try:
        return labels.index(arg)
    except ValueError:
        raise ValueError(f"kernel {kernel.key!r} has no parameter {arg!r}; it has {labels}") from None


class LaunchSequence:
    """Kernel launches recorded once (``wp.launch(..., record_cmd=True)``) and replayed in order.

    Replaying a recorded launch skips Warp's per-call argument packing, which dominates the cost
    of launching a small kernel from Python. A sequence is recorded for fixed arrays and sizes;
    build a new one when they change.

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
        #: A recorded launch, or a tuple of them: the chunks of one kernel (CPU only).
        self._commands: list[Any] = []
        self.names: list[str] = []

    def add(self, kernel: Any, dim: int | Sequence[int], inputs: Sequence[Any]) -> None:
        """Record one launch (nothing runs); a launch over zero threads is dropped.

        Raises:
            KernelLaunchError: Warp returned no launch: the kernel's module could not be built
                or loaded for this device (the first attempt raised the cause).
        """
        if _threads(dim) <= 0:
            return  # Warp records nothing for an empty grid (it returns None)
        self._commands.append(self._record(kernel, dim, inputs))
        self.names.append(kernel.key)

    def add_chunked(self, kernel: Any, dim: int, inputs: Sequence[Any], start_at: int | str = "start",
                    per_chunk: dict[int | str, Sequence[Any]] | None = None, min_dim: int | None = None,
                    bounds: Sequence[int] | None = None) -> None:
        """Record a kernel whose thread ``t`` does item ``start + t``, cut into
        :func:`chunks_for` ranges: on a CPU the ranges run on several threads; on a GPU it is
        one launch with ``start = 0``.

        Without ``per_chunk`` the items are independent, and each thread gets one range of
        consecutive chunks (:func:`_one_range_per_thread`): the same results in one call into
        Warp per thread. The threads are counted when the launch is recorded (a sequence is
        recorded again when its arrays or sizes change).

        Args:
            kernel: A kernel with an argument (``start_at``) that is the first item's index.
            dim: Items in all.
            inputs: The arguments (the start argument's value is replaced).
            start_at: The start argument, by name (the kernel's parameter) or position.
            per_chunk: Arguments that differ by chunk (name or position -> one value per
                chunk), such as a buffer each chunk adds into alone; a chunk's writes must not
                meet another's.
            min_dim: Cut only from this many threads on (default :data:`MIN_CHUNKED_DIM`); a
                kernel of a few threads that each do much (a strided walk) is cut from fewer.
            bounds: Where a CPU cuts (``0 = bounds[0] < ... < bounds[-1] = dim``) instead of
                :func:`chunks_for` even ranges, such as at system boundaries so that ranges
                never write the same items; a GPU still launches once.
        """
        if dim <= 0:
            return
        start = _argument_index(kernel, start_at)
        chunked = {_argument_index(kernel, k): v for k, v in (per_chunk or {}).items()}
        n = chunks_for(self.device, dim, min_dim)
        if bounds is not None and n > 1:
            n = len(bounds) - 1
            assert bounds[0] == 0 and bounds[-1] == dim and all(a < b for a, b in zip(bounds, bounds[1:])), bounds
        else:
            bounds = [dim * c // n for c in range(n + 1)]
        if not chunked and n > 1:
            bounds = _one_range_per_thread(bounds)
            n = len(bounds) - 1
        commands = []
        for c in range(n):
            args = list(inputs)
            args[start] = bounds[c]
            for index, values in chunked.items():
                args[index] = values[c]
            if bounds[c + 1] > bounds[c]:
                commands.append(self._record(kernel, bounds[c + 1] - bounds[c], args))
        self._commands.append(commands[0] if len(commands) == 1 else Ranges(commands))
        self.names.append(kernel.key)

    def _record(self, kernel: Any, dim: int | Sequence[int], inputs: Sequence[Any]) -> Any:
        cmd = warp_recordings.record(warp(), kernel, dim, inputs, self.device)
        if cmd is None:
            raise KernelLaunchError(
                f"{self.who}: Warp could not prepare kernel {kernel.key!r} for device {self.device}: "
                "building or loading its module failed earlier (see the first error; on a CPU device "
                "Warp needs its CPU compiler, on a GPU a working CUDA driver)"
            )
        return cmd

    def run(self, stream: Any = None) -> None:
        """Launch every recorded kernel, in order, on ``stream`` (the device's default if None);
        the chunks of a CPU kernel run on the worker threads, all finished before the next kernel."""
        for cmd in self._commands:
            if type(cmd) is Ranges:
                _run_chunks(cmd)
            else:
                cmd.launch(stream)

    def __len__(self) -> int:
        return len(self._commands)


#: Float scalars of a batch's precision, and [N, 3] tensors as vectors, by torch dtype.
def _scalar_types() -> dict[torch.dtype, Any]:
    wp = warp()
    return {torch.float32: wp.float32, torch.float64: wp.float64}


def _vector_types() -> dict[torch.dtype, Any]:
    wp = warp()
    return {torch.float32: wp.vec3f, torch.float64: wp.vec3d}


class RecordedLaunches:
    """Named launches, each recorded once and replayed while its arguments stay the same objects.

    Arguments are torch tensors (converted zero-copy; an argument whose name is in
    ``vector_args`` becomes a vec3 array), Python ints, or ``(value, torch dtype)`` pairs for float
    scalars of the batch's precision. A tensor counts as unchanged while it is the same object:
    the batch keeps its field views, and the caller its buffers, until the set of systems
    changes; the recorded launch holds the tensors, so an object cannot be freed and its id
    reused meanwhile.

    Args:
        vector_args: Kernel argument names that take ``[N, 3]`` tensors as vec3 arrays.
    """

    def __init__(self, vector_args: frozenset[str] = frozenset()) -> None:
        self.vector_args = vector_args
        self._recorded: dict[str, tuple[int | tuple[int, ...], tuple[Any, ...], LaunchSequence]] = {}

    def launch(self, name: str, kernel: Any, dim: int | tuple[int, ...], args: Sequence[Any], device: torch.device,
               start_at: str | None = None, min_dim: int | None = None) -> None:
        """Launch ``kernel`` over ``dim`` threads (a grid with a tuple) on torch's current stream
        of ``device``.

        With ``start_at``, the name of the kernel's argument that is the first item's index (its
        thread ``t`` doing item ``start + t``; pass 0 for it), a CPU runs the launch in
        :func:`chunks_for` ranges on its worker threads, as :meth:`LaunchSequence.add_chunked`
        does (from ``min_dim`` threads on); the items' writes must not meet. A GPU launches once.
        """
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
        if start_at is None:
            seq.add(kernel, dim, inputs)
        else:
            assert isinstance(dim, int), "a launch in ranges is one-dimensional"
            seq.add_chunked(kernel, dim, inputs, start_at=start_at, min_dim=min_dim)
        seq.run(stream)
        self._recorded[name] = (dim, tuple(args), seq)

    def _to_warp(self, label: str, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            vectors = _vector_types()
            if value.dtype in vectors and label in self.vector_args:
                return warp().from_torch(value, dtype=vectors[value.dtype])
            return warp().from_torch(value)
        if isinstance(value, tuple):  # (python float, torch dtype): a typed scalar
            return _scalar_types()[value[1]](value[0])
        return value

    def clear(self) -> None:
        self._recorded.clear()


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
    ``wp.Launch``; later launches only replace its arguments (array descriptors from
    ``from_torch(..., return_ctype=True)``, scalars packed in place) and replay it: about ten
    times less host work than ``wp.launch``, which resolves a generic kernel's overload from
    its arguments at every call.
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
        entry = launches[key] = [wp.launch(kernel, dim=dims, inputs=inputs, device=target, record_cmd=True), dims,
                                 bound]
    else:
        recorded, held = entry[0], entry[2]
        # Only arguments that differ from those bound last are set again: a caller that passes
        # the same tensors at every call (a check's fields) pays for a comparison only.
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
