"""The shared scratch buffers and Warp runtime: reuse without allocation, nothing imported early."""

from __future__ import annotations

import subprocess
import sys

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
