"""The native executor of CPU kernel ranges (:mod:`alchemi_core.cpu_executor`): the ranges run at
once on the calling thread and a worker, every item once, the same bits as the thread pool; a
worker sleeps after its spin and is woken for the next kernel; a second thread, an older Warp
and a disabled executor take the pool."""

from __future__ import annotations

import functools
import threading
import time

import pytest
import torch

from alchemi_core import cpu_executor, warp_runtime


@pytest.fixture
def wp(monkeypatch):
    warp = pytest.importorskip("warp")
    warp_runtime.warp()
    if not warp.is_cpu_available():
        pytest.skip("this warp-lang build has no CPU compiler")
    if not cpu_executor.runs_ranges(warp):
        pytest.skip(f"warp-lang {warp.config.version} passes a CPU kernel's arguments one by one")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(cpu_executor, "_executor", None)  # each test its own executor
    # Workers spin long enough here that a caller descheduled between waking one and posting
    # (other work on a 2-core CI machine) still finds it; each test stops them at its end.
    monkeypatch.setattr(cpu_executor, "SPIN_SECONDS", 0.5)
    yield warp
    made = cpu_executor._executor
    if made is not None:  # no loop left spinning for the tests after this one
        assert made.stop()


@functools.cache
def _meeting_kernel():
    import warp as wp

    @wp.kernel
    def meet(arrived: wp.array(dtype=wp.int32), saw_other: wp.array(dtype=wp.int32), patience: wp.int64, start: int):
        # Item i arrives, then waits (a bounded while) for the other item: both see each other
        # only if their ranges run at the same time on two threads.
        i = wp.tid() + start
        wp.atomic_add(arrived, i, 1)
        other = 1 - i
        k = wp.int64(0)
        while k < patience:
            if wp.atomic_add(arrived, other, 0) > 0:
                saw_other[i] = 1
                k = patience
            k += wp.int64(1)

    return meet


def _meeting(wp, patience: int = 10**10) -> tuple[list[int], warp_runtime.LaunchSequence]:
    """Run ``meet`` over two items in two ranges. ``patience``: its wait, in iterations of about a
    nanosecond (the default seconds: a thread woken on a CPU that other work keeps busy can take
    tens of milliseconds to start)."""
    arrived, saw = torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    seq = warp_runtime.LaunchSequence(warp_runtime.warp_device(torch.device("cpu")))
    seq.add_chunked(_meeting_kernel(), 2, [warp_runtime.view(arrived), warp_runtime.view(saw), wp.int64(patience), 0], min_dim=1)
    assert [c.bounds.size for c in seq._commands[0]] == [1, 1]  # one item per thread
    seq.run()
    assert arrived.tolist() == [1, 1]  # every item once
    return saw.tolist(), seq


def test_the_ranges_run_at_once_on_the_caller_and_a_spinning_worker(wp):
    saw, seq = _meeting(wp)
    assert saw == [1, 1]
    prepared = seq._commands[0].prepared
    assert isinstance(prepared, cpu_executor.Prepared)  # the executor ran them, not the pool
    executor = cpu_executor._executor
    assert executor is not None and executor.workers == 1
    assert executor.sleeping() == []  # still spinning, ready for the next kernel
    for _ in range(20):  # back to back, as a run's kernels come
        assert _meeting(wp)[0] == [1, 1]


def test_a_worker_sleeps_after_its_spin_and_is_woken_for_the_next_kernel(wp):
    assert _meeting(wp)[0] == [1, 1]
    executor = cpu_executor._executor
    deadline = time.monotonic() + 10.0
    while executor.sleeping() != [0] and time.monotonic() < deadline:  # after its 0.5 s
        time.sleep(0.01)
    assert executor.sleeping() == [0]
    assert _meeting(wp)[0] == [1, 1]  # woken the slow way; the caller waited for its range
    assert cpu_executor._executor is executor


def test_a_shorter_spin_applies_to_the_next_loop_started(wp, monkeypatch):
    assert _meeting(wp)[0] == [1, 1]  # a loop spinning for the fixture's 0.5 s
    executor = cpu_executor._executor
    assert executor.stop()
    monkeypatch.setattr(cpu_executor, "SPIN_SECONDS", 0.005)
    assert _meeting(wp)[0] == [1, 1]
    start = time.monotonic()
    while executor.sleeping() != [0] and time.monotonic() - start < 5.0:
        time.sleep(0.002)
    assert time.monotonic() - start < 0.4  # well before the 0.5 s the first loop was given


def test_a_kernel_posted_while_the_worker_sleeps_is_run_by_the_caller_alone(wp, monkeypatch):
    """No range waits for a worker: with its loop never started, the caller runs both items (one
    after the other, so the first never sees the second)."""
    _meeting(wp, patience=1)
    executor = cpu_executor._executor
    assert executor.stop()  # every loop asleep
    monkeypatch.setattr(executor._threads, "submit", lambda loop: None)  # and the wake-up lost
    saw, _ = _meeting(wp, patience=1000)
    assert saw == [0, 1]
    executor._words[executor._state] = 0  # the loop marked as starting never will


def test_a_second_thread_runs_its_ranges_on_the_pool(wp):
    _meeting(wp, patience=1)
    executor = cpu_executor._executor
    with executor._busy:  # as while another thread's kernel is on the executor
        done: list[list[int]] = []
        thread = threading.Thread(target=lambda: done.append(_meeting(wp)[0]))
        thread.start()
        thread.join(timeout=60)
    assert done == [[1, 1]]


def test_the_executor_gives_the_pools_bits_for_buffers_per_range(wp, monkeypatch):
    """A half list's ranges add into buffers of their own: the same sums either way."""
    from ase.build import bulk

    lj = pytest.importorskip("alchemi_potentials")
    from alchemi_core.data import Batch
    from alchemi_potentials.neighbors import BatchedNeighborList

    monkeypatch.setattr(warp_runtime, "MIN_CHUNKED_DIM", 1)
    cells = []
    for seed, repeat in enumerate((1, 2, 3)):  # uneven systems: ranges cannot cut at their edges
        atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(repeat)
        atoms.rattle(0.1, seed=seed)
        cells.append(atoms)
    outs = []
    for enabled in (True, False):
        monkeypatch.setattr(cpu_executor, "ENABLED", enabled)
        model = lj.LennardJones(0.0104, 3.405, 7.0, neighbor_list=BatchedNeighborList(7.0, 1.0, half_list=True))
        outs.append(model(Batch.from_atoms(cells, dtype=torch.float64), compute_stress=True))
        ranges = [c for c in model._outputs.launches._commands if isinstance(c, warp_runtime.Ranges)]
        assert ranges and all(bool(r.prepared) == enabled for r in ranges)
    for name in ("energy", "forces", "stress"):
        assert torch.equal(outs[0][name], outs[1][name]), name


def test_a_warp_without_the_structure_entry_point_keeps_the_pool(wp):
    class Old:  # a recorded launch of a Warp that passes arguments one by one (1.5)
        kernel = type("K", (), {})()
        params: list = []
        adjoint = False

    assert cpu_executor.entry(Old()) is None
    assert cpu_executor.prepare(wp, [Old(), Old()], 1) is None


def _meet_in_child(results) -> None:
    import warp

    results.put(_meeting(warp)[0])


def test_a_forked_child_starts_worker_loops_of_its_own(wp):
    import multiprocessing

    assert _meeting(wp)[0] == [1, 1]  # the parent's worker is spinning as it forks
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_meet_in_child, args=(results,))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 0
    assert results.get(timeout=5) == [1, 1]


def test_ranges_count_as_handed_to_spinning_workers_only_on_the_executor(wp, monkeypatch):
    assert warp_runtime.range_handoff() == "spinning"
    monkeypatch.setattr(cpu_executor, "ENABLED", False)
    assert warp_runtime.range_handoff() == "sleeping"
