"""Clocks, device memory and time budgets.

Timed regions start and end with a device synchronisation, so a figure is the wall time a user
waits for, device work included. Figures are medians of repeats after a warm-up.

Example:
    >>> from benchmarks.timing import Budget, timed
    >>> budget = Budget(60.0)
    >>> seconds = timed(lambda: sum(range(1000)), "cpu")
    >>> seconds >= 0.0 and budget.remaining() <= 60.0
    True
"""

from __future__ import annotations

import collections
import functools
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import torch


class DeadlineExceeded(RuntimeError):
    """A framework ran past the time it was given; the workload reports it as timed out."""


def synchronize(device: str) -> None:
    """Wait for the device (no-op on the CPU)."""
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> float:
    """Seconds ``fn()`` takes, the device's queued work before and after included."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def timed_compiled_or_eager(make: Callable[[], tuple[Any, Any]], device: str) -> tuple[float, Any, Any, str | None]:
    """Seconds of ``stage.run(batch)`` for a fresh ``(stage, batch) = make()``, its step captured
    as a CUDA graph (``stage.compile()``) where that works, else eager from a fresh start:
    ``(seconds, stage, batch, why the capture failed or None)``."""
    graph_error = None
    for compiled in (True, False):
        stage, batch = make()
        if compiled:
            stage = stage.compile()

        def go(stage: Any = stage, batch: Any = batch) -> None:
            with stage:
                stage.run(batch)

        try:
            return timed(go, device), stage, batch, graph_error
        except Exception as exc:  # noqa: BLE001 - a failed capture is reported; the eager run is measured
            if not compiled:
                raise
            graph_error = f"{type(exc).__name__}: {exc}"
    raise AssertionError("unreachable")  # pragma: no cover


def timed_until_deadline(fn: Callable[[], Any], device: str) -> tuple[float, bool]:
    """Like :func:`timed`, but a :class:`DeadlineExceeded` inside ``fn`` ends the clock instead
    of the caller: returns ``(seconds, completed)``, so what was done in time can be reported."""
    completed = True

    def guarded() -> None:
        nonlocal completed
        try:
            fn()
        except DeadlineExceeded:
            completed = False

    return timed(guarded, device), completed


def median(values: list[float]) -> float:
    return float(statistics.median(values))


class Budget:
    """Wall-clock seconds for a whole invocation, shared out to workloads and frameworks.

    Args:
        seconds: The total; None for no limit.
    """

    def __init__(self, seconds: float | None) -> None:
        self.start = time.perf_counter()
        self.seconds = seconds

    def remaining(self) -> float:
        if self.seconds is None:
            return float("inf")
        return self.seconds - (time.perf_counter() - self.start)

    def deadline(self, cap: float) -> float:
        """An absolute ``perf_counter`` time: ``cap`` seconds from now, or the budget's end."""
        return time.perf_counter() + max(0.0, min(cap, self.remaining()))


def check_deadline(deadline: float | None) -> None:
    """Raise :class:`DeadlineExceeded` when ``deadline`` (a ``perf_counter`` time) has passed.

    A host clock read only: safe inside a step loop, it never waits for the device.
    """
    if deadline is not None and time.perf_counter() > deadline:
        raise DeadlineExceeded("ran past its time cap")


class DeviceMemory:
    """Device memory a framework uses for one workload, per atom.

    ``peak_bytes_per_atom`` is ``torch.cuda.max_memory_allocated()`` above what was allocated at
    the start (what torch's allocator served: tensors, and Warp arrays made from them);
    ``device_bytes_per_atom`` is the growth of the device's used memory (``mem_get_info``, after
    emptying torch's cache), which also counts memory Warp or a peer allocates outside torch.
    Both are None on the CPU.
    """

    def __init__(self, device: str) -> None:
        self.device = device
        self.base = 0
        self.used0 = 0

    def start(self) -> None:
        if self.device != "cuda":
            return
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        self.base = torch.cuda.memory_allocated()
        free, total = torch.cuda.mem_get_info()
        self.used0 = total - free

    def per_atom(self, atoms: int) -> dict[str, float | None]:
        if self.device != "cuda" or atoms <= 0:
            return {"peak_bytes_per_atom": None, "device_bytes_per_atom": None}
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - self.base
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        return {"peak_bytes_per_atom": peak / atoms, "device_bytes_per_atom": (total - free - self.used0) / atoms}


class CallTimer:
    """Wall time and calls of wrapped functions, summed by label over every thread that calls them.

    Example:
        >>> class Box:
        ...     def work(self, n):
        ...         return n + 1
        >>> timer = CallTimer()
        >>> timer.wrap(Box, "work", lambda box, n: f"work {n}")
        >>> Box().work(1), Box().work(1), timer.calls["work 1"]
        (2, 2, 2)
        >>> timer.restore(); hasattr(Box.work, "__wrapped__")
        False
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)
        self._lock = threading.Lock()
        self._patched: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, attr: str, label: str | Callable[..., str]) -> None:
        """Time every call of ``owner.attr`` (a module's function or a class's own method) under
        ``label``, or under ``label(*args, **kwargs)`` of the call."""
        original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        timer = self

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                key = label if isinstance(label, str) else label(*args, **kwargs)
                with timer._lock:
                    timer.seconds[key] += elapsed
                    timer.calls[key] += 1

        self._patched.append((owner, attr, original))
        setattr(owner, attr, timed)

    def restore(self) -> None:
        """Put every wrapped function back."""
        for owner, attr, original in reversed(self._patched):
            setattr(owner, attr, original)
        self._patched.clear()
