"""The shared scratch buffers and Warp runtime: reuse without allocation, nothing imported early."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import torch

from alchemi_core.workspace import Workspace


def test_workspace_reuses_one_view_until_it_must_grow():
    ws = Workspace()
    cpu = torch.device("cpu")
    a = ws.get("noise", 4, 8, (3,), torch.float32, cpu)
    assert a is ws.get("noise", 4, 8, (3,), torch.float32, cpu)  # the same object: replayable
    base = a.untyped_storage().data_ptr()
    b = ws.get("noise", 8, 8, (3,), torch.float32, cpu)  # within capacity: same memory
    assert b.shape == (8, 3) and b.untyped_storage().data_ptr() == base
    c = ws.get("noise", 9, 8, (3,), torch.float32, cpu)  # beyond it: a new buffer
    assert c.shape == (9, 3) and c.untyped_storage().data_ptr() != base
    assert ws.get("noise", 9, 8, (3,), torch.float64, cpu).dtype == torch.float64


def test_importing_core_and_its_runtime_loads_no_warp():
    code = "import sys, alchemi_core, alchemi_core.warp_runtime, alchemi_core.workspace; print('warp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_ranges_of_a_cpu_kernel_cover_every_item_once_and_run_on_several_threads():
    wp = pytest.importorskip("warp")
    from alchemi_core import warp_runtime

    warp_runtime.warp()
    if not wp.is_cpu_available():
        pytest.skip("this warp-lang build has no CPU compiler")
    counts = torch.zeros(10_000, dtype=torch.int32)
    seq = warp_runtime.LaunchSequence(warp_runtime.warp_device(torch.device("cpu")))
    seq.add_chunked(_count_kernel(), counts.numel(), [warp_runtime.view(counts), 0])  # its "start", by name
    with pytest.raises(ValueError, match="has no parameter 'begin'"):
        seq.add_chunked(_count_kernel(), counts.numel(), [warp_runtime.view(counts), 0], start_at="begin")
    assert warp_runtime.chunks_for("cpu", counts.numel()) == warp_runtime.CPU_CHUNKS
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            seq.run()
    finally:
        torch.set_num_threads(before)
    assert torch.equal(counts, torch.full_like(counts, 2))  # every item once per run, twice in all
    assert warp_runtime.chunks_for("cuda:0", 10**7) == 1  # a GPU launch is never cut


def test_a_short_cpu_kernel_is_cut_in_ranges_when_asked(monkeypatch):
    """``min_dim``: a few threads that each stride over much work (a listed search) are cut too,
    into one range per thread (the items are independent); a kernel with a buffer per range keeps
    its ``CPU_CHUNKS`` ranges, whose sums must not depend on the thread count."""
    wp = pytest.importorskip("warp")
    from alchemi_core import warp_runtime

    warp_runtime.warp()
    if not wp.is_cpu_available():
        pytest.skip("this warp-lang build has no CPU compiler")
    assert warp_runtime.chunks_for("cpu", 64) == 1
    assert warp_runtime.chunks_for("cpu", 64, min_dim=1) == warp_runtime.CPU_CHUNKS
    assert warp_runtime.chunks_for("cuda:0", 64, min_dim=1) == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    counts = torch.zeros(64, dtype=torch.int32)
    seq = warp_runtime.LaunchSequence(warp_runtime.warp_device(torch.device("cpu")))
    seq.add_chunked(_count_kernel(), counts.numel(), [warp_runtime.view(counts), 0], min_dim=1)
    assert [c.bounds.size for c in seq._commands[0]] == [16, 24, 24]  # 8 ranges of 8, merged per thread
    seq.run()
    assert torch.equal(counts, torch.ones_like(counts))
    per_range = torch.zeros(warp_runtime.CPU_CHUNKS, 64, dtype=torch.int32)
    buffered = warp_runtime.LaunchSequence(warp_runtime.warp_device(torch.device("cpu")))
    buffered.add_chunked(_count_kernel(), 64, [warp_runtime.view(counts), 0], min_dim=1,
                         per_chunk={"counts": [warp_runtime.view(row) for row in per_range]})
    assert len(buffered._commands[0]) == warp_runtime.CPU_CHUNKS
    buffered.run()
    assert torch.equal(per_range.sum(0), torch.ones(64, dtype=torch.int32))  # each range into its own row
    assert torch.equal(per_range.count_nonzero(1), torch.full((warp_runtime.CPU_CHUNKS,), 8))


def test_the_ranges_run_on_as_many_threads_as_torch_uses():
    from alchemi_core import warp_runtime

    seen: list[int] = []
    together = threading.Barrier(2, timeout=10)  # passes only when two launches run at once

    class Launch:
        def __init__(self, wait: bool) -> None:
            self.wait = wait

        def launch(self) -> None:
            seen.append(threading.get_ident())
            if self.wait:
                together.wait()

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        warp_runtime._run_chunks([Launch(True), Launch(True)])
        assert len(set(seen)) == 2
        torch.set_num_threads(1)
        seen.clear()
        warp_runtime._run_chunks([Launch(False) for _ in range(4)])
        assert seen == [threading.get_ident()] * 4
    finally:
        torch.set_num_threads(before)


def test_a_forked_child_runs_cpu_ranges_on_threads_of_its_own():
    import multiprocessing as mp

    from alchemi_core import warp_runtime

    class Launch:
        def launch(self) -> None:
            time.sleep(0.001)

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        warp_runtime._run_chunks([Launch(), Launch()])  # the parent's pool exists now
        child = mp.get_context("fork").Process(target=warp_runtime._run_chunks, args=([Launch(), Launch()],))
        child.start()
        child.join(timeout=20)
        hung = child.is_alive()
        if hung:
            child.kill()
        assert not hung and child.exitcode == 0  # reusing the parent's (threadless) pool hangs
    finally:
        torch.set_num_threads(before)


def test_a_replayed_launch_binds_each_argument_again_only_when_it_changed():
    """launch_args keeps what its recorded launch holds: the same tensor again is not set
    again, a new tensor (even of one shape), a view at another offset, a new scalar or size is."""
    wp = pytest.importorskip("warp")
    from alchemi_core import warp_runtime

    warp_runtime.warp()
    if not wp.is_cpu_available():
        pytest.skip("this warp-lang build has no CPU compiler")
    kernel, cpu = _count_kernel(), torch.device("cpu")
    a, b = torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    warp_runtime.launch_args(kernel, 4, (a, 0), cpu)
    warp_runtime.launch_args(kernel, 4, (a, 0), cpu)  # same arguments: replayed as bound
    warp_runtime.launch_args(kernel, 4, (b, 2), cpu)  # another tensor and start
    warp_runtime.launch_args(kernel, 4, (b[2:], 2), cpu)  # a view at an offset: counts[t + 2] of b[2:]
    warp_runtime.launch_args(kernel, 2, (a, 6), cpu)  # fewer threads
    assert a.tolist() == [2, 2, 2, 2, 0, 0, 1, 1]
    assert b.tolist() == [0, 0, 1, 1, 2, 2, 1, 1]


def _count_kernel():
    import warp as wp

    @wp.kernel
    def count_once(counts: wp.array(dtype=wp.int32), start: int):
        counts[wp.tid() + start] += 1

    return count_once
