"""The shared scratch buffers and Warp runtime: reuse without allocation, nothing imported early."""

from __future__ import annotations

import subprocess
import sys

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
