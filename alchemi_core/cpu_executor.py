"""The ranges of a CPU kernel run by worker threads that wait for them spinning in native code.

A kernel cut into ranges (:meth:`alchemi_core.warp_runtime.LaunchSequence.add_chunked`) used to
run them through a Python thread pool: the caller handed a range to a worker thread, which slept
until then. Waking a sleeping thread costs 100-200 us on a 2-core virtual machine (``python -m
benchmarks.cpu_dispatch``), paid by W6's step twice (the pair kernel and the neighbour search),
about a tenth of it.

Here a worker thread, once started, runs a small native loop (a Warp kernel of one thread, so
without Python's interpreter lock) that watches a shared mailbox for work, spinning with the
CPU's pause instruction, and returns to the pool only after :data:`SPIN_SECONDS` without any
(as OpenMP's workers spin for a while before they sleep). The caller posts a kernel's ranges
to the mailbox as a table of ``(entry point, launch bounds, arguments)``: each range is a Warp
launch recorded as usual, called through the same C entry point Warp's own ``invoke`` calls,
with its arguments packed once. The caller and the workers take ranges from one atomic counter
until none is left, and the caller returns once every range has finished; a worker that is
asleep is woken the old way for the next kernel, and a kernel posted while it sleeps is run by
the caller alone. So no range waits on a worker, and the results are those of the thread pool:
each range is the same launch, and ranges that write one buffer each keep doing so.

It needs a warp-lang whose CPU kernels take their arguments in one structure (1.19 does, 1.5
passes them one by one): elsewhere, and for a launch Warp calls another way (tile blocks),
:func:`prepare` returns None and the thread pool runs the ranges. The kernels are in
:mod:`alchemi_core.cpu_executor_kernels`.

Example:
    >>> from alchemi_core import cpu_executor
    >>> cpu_executor.SPIN_SECONDS
    0.002
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from alchemi_core import warp_recordings

#: How long a worker spins without work before it returns to the pool and sleeps: more than the
#: gap between two chunked kernels of one step (W6: about 1 ms), so a run keeps its workers awake.
#: Read when a worker's loop starts.
SPIN_SECONDS = 0.002
#: Whether chunked CPU kernels go through this executor (where Warp allows it); False: the pool.
ENABLED = True
#: Worker threads at most (the mailbox has a state word for each).
MAX_WORKERS = 56


def entry(launch: Any) -> tuple[int, Any, Any] | None:
    """``(entry point address, bounds, arguments)`` of a recorded CPU launch, its arguments packed
    once into the structure Warp's ``invoke`` passes (None where this Warp calls it another way:
    releases before the structure, tile blocks, adjoints)."""
    kernel, params = launch.kernel, launch.params
    if getattr(kernel, "_invoke_cache", None) is None or launch.adjoint or getattr(launch, "block_dim", 1) > 1:
        return None
    fields = [(arg.label, type(params[1 + i])) for i, arg in enumerate(kernel.adj.args)]
    args = type("ArgsStruct", (ctypes.Structure,), {"_fields_": fields})()
    for i, (name, _) in enumerate(fields):
        setattr(args, name, params[1 + i])
    address = ctypes.cast(launch.hooks.forward, ctypes.c_void_p).value
    return (address, params[0], args) if address else None


class _Call:
    """A call of a recorded CPU launch through its entry point, arguments packed once; the
    interpreter's lock is released while the kernel runs."""

    __slots__ = ("_function", "_bounds", "_args", "_held")

    def __init__(self, launch: Any) -> None:
        found = entry(launch)
        if found is None:
            raise RuntimeError(f"Warp {launch.kernel.key!r}: no structure entry point")
        address, bounds, args = found
        self._function = _ENTRY_TYPE(address)
        self._bounds, self._args = ctypes.addressof(bounds), ctypes.addressof(args)
        self._held = (launch, bounds, args)  # what the two addresses point into

    def __call__(self) -> None:
        self._function(self._bounds, self._args)


_ENTRY_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


class Prepared:
    """One kernel's ranges as a task table for the executor (made by :func:`prepare`)."""

    def __init__(self, executor: Executor, launches: Sequence[Any], entries: Sequence[tuple[int, Any, Any]]) -> None:
        wp = executor.wp
        #: The kernel's name (for timers and errors).
        self.key: str = launches[0].kernel.key if launches else ""
        # The launches own the arrays; the entries the bounds and arguments the table points into.
        self._held = (list(launches), list(entries))
        table = [[address, ctypes.addressof(bounds), ctypes.addressof(args)] for address, bounds, args in entries]
        self.table = wp.array(table, dtype=wp.int64, device="cpu")
        self._dispatch = _Call(executor.record(executor.dispatch_kernel, [executor.mailbox, self.table]))
        self._executor = executor

    def run(self) -> bool:
        """Run every range, the calling thread taking part; False (nothing ran) while another
        thread is using the executor: run them some other way."""
        return self._executor.run(self._dispatch)


class Executor:
    """The mailbox, the worker loops and their state."""

    def __init__(self, wp: Any, workers: int) -> None:
        from alchemi_core import cpu_executor_kernels as native

        self.wp = wp
        self.dispatch_kernel, worker_kernel, spin_kernel = native.kernels(wp)
        self.mailbox = wp.zeros(native.STATE + MAX_WORKERS, dtype=wp.int64, device="cpu")
        self._words = self.mailbox.numpy()
        self._state = native.STATE
        self.workers = min(workers, MAX_WORKERS)
        # Threads of their own: a loop holds its thread while it spins.
        self._threads = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="alchemi-spin")
        self._busy = threading.Lock()
        self._spin_word = native.SPIN
        self._per_pause = self._time_a_pause(spin_kernel)
        self._spin_seconds = -1.0  # set from SPIN_SECONDS at each run (a loop reads it as it starts)
        self._loops = [_Call(self.record(worker_kernel, [self.mailbox, w])) for w in range(self.workers)]

    def record(self, kernel: Any, inputs: list[Any]) -> Any:
        """A recorded launch of ``kernel`` over one thread (the runtime's recordings)."""
        return warp_recordings.record(self.wp, kernel, 1, inputs, self.wp.get_device("cpu"))

    def forked(self) -> None:
        """In a forked child: no worker loop runs, and none of the parent's threads exists."""
        self._threads = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="alchemi-spin")
        self._busy = threading.Lock()
        self._words[self._state:self._state + self.workers] = 0

    def _time_a_pause(self, spin_kernel: Any) -> float:
        """Seconds of one of a worker's idle pauses on this CPU (timed once)."""
        count = 100_000
        spin = _Call(self.record(spin_kernel, [self.mailbox, count]))
        spin()
        start = time.perf_counter()
        spin()
        return max((time.perf_counter() - start) / count, 1e-10)

    def stop(self, timeout: float = 10.0) -> bool:
        """Send every worker loop to sleep now (not after its spin); True once none runs."""
        from alchemi_core.cpu_executor_kernels import STOP

        self._words[STOP] = 1
        deadline = time.monotonic() + timeout
        while len(self.sleeping()) < self.workers and time.monotonic() < deadline:
            time.sleep(0.0005)
        self._words[STOP] = 0
        return len(self.sleeping()) == self.workers

    def sleeping(self) -> list[int]:
        """The workers whose loop is not running."""
        return [w for w in range(self.workers) if self._words[self._state + w] == 0]

    def run(self, dispatch: Callable[[], None]) -> bool:
        if not self._busy.acquire(blocking=False):
            return False
        try:
            if self._spin_seconds != SPIN_SECONDS:
                self._spin_seconds = SPIN_SECONDS
                self._words[self._spin_word] = max(1000, int(SPIN_SECONDS / self._per_pause))
            for w in self.sleeping():
                # Marked running here, so that it is not submitted twice before its loop starts;
                # a loop that runs out of idle pauses marks itself sleeping again.
                self._words[self._state + w] = 1
                try:
                    self._threads.submit(self._loops[w])
                except RuntimeError:  # the interpreter is shutting down: the caller runs them all
                    self._words[self._state + w] = 0
            dispatch()
        finally:
            self._busy.release()
        return True


def runs_ranges(wp: Any) -> bool:
    """Whether chunked CPU kernels go through the executor with the ``warp`` module ``wp``
    (:data:`ENABLED`, and a Warp whose CPU kernels take one structure): ranges then cost a few
    microseconds a kernel, not a thread's wake-up."""
    return ENABLED and _supported(wp)


@functools.cache
def _supported(wp: Any) -> bool:
    from alchemi_core import cpu_executor_kernels as native

    try:
        return hasattr(native.kernels(wp)[0], "_invoke_cache")  # set by Warp's Kernel (nothing compiles)
    except Exception:  # a Warp that cannot even declare them
        return False


_executor: Executor | None = None
_executor_lock = threading.Lock()


def prepare(wp: Any, launches: Sequence[Any], workers: int) -> Prepared | None:
    """The ranges ``launches`` (recorded CPU launches of one kernel) ready to run with ``workers``
    worker loops besides the calling thread, or None where they cannot: not
    :data:`ENABLED`, no worker, an older Warp, a launch Warp calls another way."""
    global _executor
    if not ENABLED or workers < 1:
        return None
    entries = [entry(launch) for launch in launches]
    if any(e is None for e in entries) or len(entries) > 0xFFFF:
        return None
    with _executor_lock:
        if _executor is None or _executor.workers < min(workers, MAX_WORKERS):
            _executor = Executor(wp, workers)
        executor = _executor
    return Prepared(executor, launches, entries)  # type: ignore[arg-type]


def _after_fork_in_child() -> None:
    # A forked child has the mailbox but none of the worker threads (nor a lock held by one).
    if _executor is not None:
        _executor.forked()


os.register_at_fork(after_in_child=_after_fork_in_child)
