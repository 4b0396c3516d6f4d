"""Worker processes that build a dataset's structures for ``SizeAwareSampler(workers=N)``.

A dataset that makes its structures on request (reads files, generates cells) costs the
engine's process host time for every structure that enters a run. Here they are built in
``workers`` processes, a chunk per task, and come back as plain arrays (a tensor sent between
processes goes through shared memory, which costs more than building a small structure).

Workers are forked where the platform can (Linux): they inherit the dataset and never touch the
GPU. Elsewhere they are spawned, and the dataset must be picklable.

Example:
    >>> import torch
    >>> from alchemi_core.data import AtomicData
    >>> from alchemi_core.data.datapipes import ListDataset
    >>> ds = ListDataset([AtomicData(atomic_numbers=torch.ones(n, dtype=torch.long),
    ...                              positions=torch.zeros(n, 3)) for n in (3, 5)])
    >>> pool = BuildPool(ds, workers=1)
    >>> [p.result().num_nodes for p in pool.submit([1, 0], stored=False)]
    [5, 3]
    >>> pool.close()
"""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np
import torch

from alchemi_core.data import AtomicData
from alchemi_core.data.datapipes import as_atomic_data
from alchemi_core.data.fields import Level
from alchemi_core.errors import AlchemiError

#: Structures per task: sending a task costs little per structure, and the first comes soon.
CHUNK = 16

#: The dataset a worker builds from (set once per worker process by ``_start_worker``).
_DATASET: Any = None


def _start_worker(dataset: Any) -> None:
    global _DATASET
    _DATASET = dataset
    torch.set_num_threads(1)  # several workers share the host's cores


def _pack(data: AtomicData) -> tuple[dict[str, Any], dict[str, str]]:
    """Fields as numpy arrays where numpy holds their dtype (tensors otherwise), and levels."""
    fields: dict[str, Any] = {}
    for name, t in data:
        try:
            fields[name] = t.detach().cpu().numpy()
        except TypeError:  # bfloat16 and the like: pickled as a tensor
            fields[name] = t
    return fields, {name: level.value for name, level in data.levels.items()}


def _unpack(packed: tuple[dict[str, Any], dict[str, str]]) -> AtomicData:
    """An ``AtomicData`` of checked fields, without checking them again (the worker did)."""
    fields, levels = packed
    out = object.__new__(AtomicData)
    object.__setattr__(out, "_fields", {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                                        for k, v in fields.items()})
    object.__setattr__(out, "_levels", {k: _LEVELS[v] for k, v in levels.items()})
    return out


_LEVELS = {level.value: level for level in Level}


def _sendable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError that names it."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any failure to pickle: send its text instead
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def _build_chunk(indices: list[int], stored: bool) -> list[tuple[bool, Any]]:
    """In a worker: each structure packed, or the exception building it raised."""
    get_stored = getattr(_DATASET, "get_stored", None) if stored else None
    out: list[tuple[bool, Any]] = []
    for i in indices:
        try:
            item = get_stored(i) if get_stored is not None else _DATASET[i]
            out.append((True, _pack(as_atomic_data(item, i))))
        except Exception as exc:  # noqa: BLE001 - raised again where the structure is requested
            out.append((False, _sendable(exc)))
    return out


class WorkerLost(AlchemiError):
    """A worker process stopped while building structures (killed, out of memory, crashed)."""


class Pending:
    """One structure on its way from a worker: :meth:`result` waits for it."""

    __slots__ = ("_task", "_position")

    def __init__(self, task: Future, position: int) -> None:
        self._task, self._position = task, position

    def ready(self) -> bool:
        return self._task.done()

    def result(self) -> AtomicData:
        """The structure (waits for its chunk).

        Raises:
            WorkerLost: The worker building it stopped.
            Exception: What building it raised in the worker.
        """
        try:
            ok, value = self._task.result()[self._position]
        except BrokenProcessPool as exc:
            raise WorkerLost(
                "a worker process building structures stopped (killed, out of memory or crashed "
                "in the dataset's code); run the sampler with workers=0 to build them in this process "
                "and see the error"
            ) from exc
        if not ok:
            raise value
        return _unpack(value)


class BuildPool:
    """``workers`` processes building structures of ``dataset`` (see the module docstring)."""

    def __init__(self, dataset: Any, workers: int) -> None:
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        self._pool: ProcessPoolExecutor | None = ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context(method), initializer=_start_worker, initargs=(dataset,)
        )

    def submit(self, indices: list[int], stored: bool) -> list[Pending]:
        """Build ``indices`` in the workers, ``CHUNK`` per task; one :class:`Pending` each."""
        assert self._pool is not None, "the pool was closed"
        out: list[Pending] = []
        for start in range(0, len(indices), CHUNK):
            chunk = indices[start:start + CHUNK]
            task = self._pool.submit(_build_chunk, chunk, stored)
            out.extend(Pending(task, k) for k in range(len(chunk)))
        return out

    def close(self) -> None:
        """Stop the workers (what they were building is dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
