"""Data-parallel runs: every rank runs the whole workflow on its own shard of the dataset.

:func:`run_data_parallel` is called by every process of a job (``torchrun`` sets ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK``; without them it is a run of one). Each rank skips what the
results store holds, runs its shard of the rest (balanced by atoms) on its device, writing to its
own part of the store; rank 0 then checks that the store holds every structure once. The ranks
share only a small gloo group (``comm:gloo``): a rank that fails records which structures it had
not stored, and the others stop after their next step with a :class:`DataParallelError`.

Example:
    >>> from alchemi_core.data.datapipes import ListDataset
    >>> from alchemi_core.dynamics import DemoDynamics, SizeAwareSampler
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> from alchemi_core.parallel import MemoryResults, run_data_parallel
    >>> from alchemi_core.testing import random_structures
    >>> def make_run(ctx):
    ...     sampler = SizeAwareSampler(ctx.dataset, max_atoms=20, max_batch_size=4)
    ...     return DemoDynamics(model=DemoModelWrapper(), n_steps=5, dt=0.5, sampler=sampler, sinks=[ctx.sink])
    >>> results = MemoryResults()
    >>> summary = run_data_parallel(make_run, ListDataset(random_structures([3, 4, 2])), results)
    >>> summary.ran, summary.complete, sorted(results.committed_ids().tolist())
    (3, True, [0, 1, 2])
    >>> run_data_parallel(make_run, ListDataset(random_structures([3, 4, 2])), results).ran   # nothing left
    0
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import attrs
import numpy as np
import torch

from alchemi_core.comm.base import CommBackend, PeerError
from alchemi_core.data.datapipes import all_metadata
from alchemi_core.dynamics.hook import Hook
from alchemi_core.dynamics.sinks import DataSink
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.errors import ConfigurationError, PipelineError
from alchemi_core.parallel.results import ResultsStore, committed_count
from alchemi_core.parallel.sharding import ShardDataset, balanced_shards, dataset_ids

#: System ids a message lists before it says how many more there are.
IDS_SHOWN = 20


class DataParallelError(PipelineError):
    """A data-parallel run stopped because a rank failed, died or was stopped.

    Attributes:
        failed_rank: The rank that failed or was lost (None: unknown, e.g. the launcher stopped
            this rank).
        unfinished: Per rank, the system ids of its shard that are not in the results store.
    """

    def __init__(self, message: str, failed_rank: int | None, unfinished: dict[int, list[int]]) -> None:
        super().__init__(message)
        self.failed_rank = failed_rank
        self.unfinished = unfinished


@attrs.frozen
class RankContext:
    """What ``make_run`` gets on each rank to build its stages.

    Attributes:
        rank, world_size, local_rank: Where this process sits in the job.
        device: Where to put the model and the batches (GPU ``LOCAL_RANK``, or the CPU).
        dataset: This rank's shard (give it to the ``SizeAwareSampler``).
        sink: This rank's part of the results store (give it to the last stage's ``sinks``).
        watch: The hook that stops this rank when another fails; the runner adds it to what
            ``make_run`` returns, or ``make_run`` adds it to its stages when it runs them itself.
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    dataset: ShardDataset
    sink: DataSink
    watch: PeerWatch


@attrs.frozen
class Progress:
    """The store's state as rank 0 sees it during a run."""

    committed: int  #: records in the store (those of earlier runs included)
    total: int  #: structures in the dataset
    elapsed_s: float
    rate_per_s: float  #: structures committed per second in this run


@attrs.frozen
class DataParallelSummary:
    """How a data-parallel run ended (the counts are over all ranks).

    Attributes:
        rank, world_size: This process's rank and the number of ranks.
        structures: Structures in the dataset.
        skipped: Already in the store when the run began (not run again).
        ran: Run in this run, by all ranks.
        atoms: Their atoms.
        wall_s: The slowest rank's time.
        committed: Records in the store at the end (rank 0; -1 on the others).
        missing: Ids of the dataset not in the store at the end (rank 0).
        duplicated: Ids stored more than once (rank 0).
        stopped: A rank was asked to stop early (``stop``): ``ran`` counts its whole shard,
            stored or not.
    """

    rank: int
    world_size: int
    structures: int
    skipped: int
    ran: int
    atoms: int
    wall_s: float
    committed: int = -1
    missing: tuple[int, ...] = ()
    duplicated: tuple[int, ...] = ()
    stopped: bool = False

    @property
    def complete(self) -> bool:
        """Rank 0: every structure is in the store exactly once."""
        return self.committed >= 0 and not self.missing and not self.duplicated


class PeerWatch(Hook):
    """Stops this rank's run when another rank failed or died; on rank 0, reports progress
    (``check_peers()`` looks at most once per heartbeat period)."""

    stage = DynamicsStage.AFTER_STEP

    def __init__(
        self,
        backend: CommBackend,
        report: Callable[[], None] | None = None,
        report_every_s: float = 10.0,
    ) -> None:
        super().__init__(frequency=1)
        self.backend = backend
        self.report = report
        self.report_every_s = float(report_every_s)
        self._next_report = time.monotonic() + self.report_every_s

    def __call__(self, batch: Any, dynamics: Any) -> None:
        self.backend.check_peers()
        if self.report is not None:
            now = time.monotonic()
            if now >= self._next_report:
                self._next_report = now + self.report_every_s
                self.report()


def print_progress(progress: Progress) -> None:
    """The default progress line (rank 0, stderr)."""
    share = 100.0 * progress.committed / max(progress.total, 1)
    print(
        f"[alchemi] {progress.committed}/{progress.total} structures in the store ({share:.1f} %), "
        f"{progress.rate_per_s:.1f}/s, {progress.elapsed_s:.0f} s",
        file=sys.stderr, flush=True,
    )


def run_data_parallel(
    make_run: Callable[[RankContext], Any],
    dataset: Any,
    results: ResultsStore,
    *,
    backend: CommBackend | None = None,
    timeout_s: float = 120.0,
    device: torch.device | str | None = None,
    progress: bool | Callable[[Progress], None] = False,
    progress_every_s: float = 10.0,
    stop: Callable[[], bool] | None = None,
) -> DataParallelSummary:
    """Run ``make_run(context).run()`` on this rank's shard of ``dataset`` (see the module docstring).

    Args:
        make_run: Builds this rank's stages from a :class:`RankContext` (a ``SizeAwareSampler``
            over ``context.dataset``, ``sinks=[context.sink]``, the model on ``context.device``)
            and returns what to ``run()``, to which ``context.watch`` is added; or runs them
            itself with ``context.watch`` among their hooks. Not called for an empty shard.
        dataset: Every structure (``len``, ``[i]``, ``get_metadata``), the same on every rank;
            structures are known by the dataset's ``system_ids()`` or their positions.
        results: The store all ranks write (e.g. ``ShardedZarrStore("results.zarr")``).
        backend: A joined ``CommBackend`` (default: ``comm:gloo`` from the torchrun environment,
            none for a single process).
        timeout_s: Longest wait for the other ranks to join, and the heartbeat staleness bound.
        device: Override the device (default: ``cuda:LOCAL_RANK`` modulo the GPUs, else the CPU).
        progress: On rank 0, report the store's progress every ``progress_every_s`` seconds
            (True: a line on stderr; a callable: called with a :class:`Progress`).
        stop: The stop request ``make_run`` gives its run (e.g. a ``StopRequest``, which then
            handles SIGTERM too). Without it SIGTERM raises, and the rank saves what it finished.

    Returns:
        The run's :class:`DataParallelSummary` (rank 0's holds the store check).

    Raises:
        DataParallelError: This rank or another failed or was lost; names what is not stored.
        ConfigurationError: The ranks disagree about the dataset or the store.
    """
    start = time.monotonic()
    owned = backend is None
    backend = _join(timeout_s) if backend is None else backend
    try:
        return _run(make_run, dataset, results, backend, device, progress, progress_every_s, start, stop)
    finally:
        if owned:
            backend.shutdown()


def _join(timeout_s: float) -> CommBackend:
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 and "MASTER_ADDR" not in os.environ:
        from alchemi_core.comm.inprocess import InProcessBackend

        return InProcessBackend.group(world_size=1, timeout_s=timeout_s)[0]
    from alchemi_core import registry

    # gloo whatever the devices: the ranks exchange a few integers, and may share a GPU (NCCL refuses).
    backend = registry.build("comm:gloo", timeout_s=timeout_s)
    backend.init()
    return backend


def rank_device(local_rank: int) -> torch.device:
    """``cuda:LOCAL_RANK`` (modulo the GPUs on this node) when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def _run(
    make_run: Callable[[RankContext], Any], dataset: Any, results: ResultsStore, backend: CommBackend,
    device: torch.device | str | None, progress: bool | Callable[[Progress], None], progress_every_s: float,
    start: float, stop: Callable[[], bool] | None = None,
) -> DataParallelSummary:
    rank, world = backend.rank, backend.world_size
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    ids = dataset_ids(dataset)
    atoms, edges = all_metadata(dataset)
    todo = np.nonzero(~np.isin(ids, results.committed_ids()))[0]
    _agree(backend, ids[todo])  # also the barrier: every rank has read the store before any writes
    shards = [todo[s] for s in balanced_shards(atoms[todo], world)]
    mine = shards[rank]
    shard = ShardDataset(dataset, mine, ids[mine], atoms[mine], edges[mine])
    sink = results.sink(rank)
    dev = torch.device(device) if device is not None else rank_device(local_rank)
    report = _reporter(progress, results, len(ids), start) if rank == 0 else None
    try:
        with _stop_on_sigterm() if stop is None else nullcontext():
            if len(shard):
                watch = PeerWatch(backend, report, progress_every_s)
                runnable = make_run(RankContext(rank, world, local_rank, dev, shard, sink, watch))
                if callable(getattr(runnable, "run", None)):
                    hooks = getattr(runnable, "hooks", None)
                    if not isinstance(hooks, list):
                        raise ConfigurationError(
                            f"make_run returned {type(runnable).__name__}, which has no hooks list; return the "
                            "FusedStage or BaseDynamics to run"
                        )
                    hooks.append(watch)
                    runnable.run()
            _close(sink)
            backend.finish()  # waits for the others, watching their heartbeats
            ran = backend.all_reduce_sum(len(shard))
            ran_atoms = backend.all_reduce_sum(shard.num_atoms)
            wall = backend.all_reduce_max(int(1000 * (time.monotonic() - start))) / 1000.0
            stopped = bool(backend.all_reduce_max(int(stop is not None and stop())))
    except BaseException as exc:
        raise _failure(exc, backend, results, ids, shards, sink) from exc
    summary = DataParallelSummary(rank, world, len(ids), len(ids) - len(todo), ran, ran_atoms, wall,
                                  stopped=stopped)
    if rank == 0:
        summary = _checked(summary, ids, results.committed_ids())
        if report is not None:
            report()
    return summary


def _agree(backend: CommBackend, todo_ids: np.ndarray) -> None:
    """Every rank must plan over the same structures (same dataset, same store)."""
    if backend.world_size == 1:
        return
    mine = (len(todo_ids), int(np.bitwise_xor.reduce(todo_ids * 2654435761 % 2**31)) if len(todo_ids) else 0)
    for value in mine:
        top = backend.all_reduce_max(value)
        if -backend.all_reduce_max(-value) != top:
            raise ConfigurationError(
                f"data-parallel rank {backend.rank} sees {len(todo_ids)} structures to run, but not every rank "
                "sees the same ones: give every rank the same dataset and the same results store"
            )


def _reporter(
    progress: bool | Callable[[Progress], None], results: ResultsStore, total: int, start: float
) -> Callable[[], None] | None:
    if progress is False or progress is None:
        return None
    show = print_progress if progress is True else progress
    first = committed_count(results)

    def report() -> None:
        try:
            now = committed_count(results)
        except Exception:  # a part another rank is creating right now: report next time
            return
        elapsed = time.monotonic() - start
        show(Progress(now, total, elapsed, (now - first) / max(elapsed, 1e-9)))

    return report


def _close(sink: DataSink) -> None:
    """Commit what the sink holds (asynchronous sinks write in the background)."""
    for name in ("close", "flush"):
        method = getattr(sink, name, None)
        if callable(method):
            method()
            return


def _checked(summary: DataParallelSummary, ids: np.ndarray, stored: np.ndarray) -> DataParallelSummary:
    values, counts = np.unique(stored, return_counts=True)
    missing = np.setdiff1d(ids, values)
    return attrs.evolve(
        summary, committed=len(stored), missing=tuple(missing.tolist()),
        duplicated=tuple(values[counts > 1].tolist()),
    )


class _Stopped(Exception):
    """The launcher asked this rank to stop (SIGTERM, as torchrun does when another worker died)."""


@contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into an exception, so a stopped rank still saves and reports its work."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise _Stopped("stopped by SIGTERM (the launcher stops every worker when one fails)")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _failure(
    exc: BaseException, backend: CommBackend, results: ResultsStore, ids: np.ndarray,
    shards: list[np.ndarray], sink: DataSink,
) -> DataParallelError:
    """Save what this rank finished, say what is not stored, tell the others, leave the group."""
    rank = backend.rank
    own = not isinstance(exc, PeerError | _Stopped)
    try:
        _close(sink)
    except Exception as close_error:  # the sink may be what failed; report the first error
        print(f"[alchemi] rank {rank}: could not save its finished structures: {close_error}", file=sys.stderr)
    try:
        stored = results.committed_ids()
    except Exception:
        stored = np.zeros(0, dtype=np.int64)
    unfinished = {r: np.setdiff1d(ids[s], stored).tolist() for r, s in enumerate(shards)}
    unfinished = {r: v for r, v in unfinished.items() if v}
    failed = rank if own else getattr(exc, "peer", None)
    if own:
        what = f"data-parallel rank {rank} failed: {type(exc).__name__}: {exc}"
    else:
        what = f"data-parallel rank {rank} stopped: {exc}"
    lines = [what]
    if failed is not None and failed != rank:
        lines.append(f"rank {failed} held {_ids(unfinished.get(failed, []))} not in the store")
    for other in sorted(set(unfinished) - {rank, failed}):
        lines.append(f"rank {other} left {_ids(unfinished[other])} not in the store")
    left = unfinished.get(rank, [])
    lines.append(f"this rank (rank {rank}) left {_ids(left)} not in the store" if left
                 else f"this rank (rank {rank}) stored all of its structures")
    missing = sum(len(v) for v in unfinished.values())
    lines.append(f"{missing} structures in all are missing; run the same command again to finish only those")
    message = "; ".join(lines)
    if own:
        backend.notify_failure(message)
    backend.abort()
    return DataParallelError(message, failed, unfinished)


def _ids(ids: list[int]) -> str:
    if not ids:
        return "no structures"
    shown = ", ".join(str(i) for i in ids[:IDS_SHOWN])
    more = f" and {len(ids) - IDS_SHOWN} more" if len(ids) > IDS_SHOWN else ""
    return f"{len(ids)} structures (system_id {shown}{more})"
