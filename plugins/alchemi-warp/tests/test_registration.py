"""alchemi-warp loads as a plugin, registers its components and changes nothing unasked."""

from __future__ import annotations

import subprocess
import sys

import torch

from alchemi_core import registry
from alchemi_core.data.buffer_ops import TorchBufferOps, buffer_ops_for


def test_plugin_loads_ok():
    records = {r.name: r for r in registry.plugins()}
    assert records["warp"].status == "ok", records["warp"].error


def test_components_resolve_by_name_and_export():
    from alchemi_core.dynamics import GPUBuffer
    from alchemi_warp.buffer_ops import WarpBufferOps
    from alchemi_warp.gpu_buffer import GPUBuffer as Direct

    assert registry.resolve("sink:gpu-buffer") is Direct
    assert GPUBuffer is Direct
    assert registry.resolve("buffer:warp") is WarpBufferOps
    sink = registry.build("sink:gpu-buffer", capacity=4, max_atoms=8, max_edges=0, device="cpu")
    assert sink.capacity == 4 and len(sink) == 0


def test_cpu_copies_stay_on_torch():
    """Installing the plugin never changes a CPU run that does not ask for Warp."""
    assert isinstance(buffer_ops_for(torch.device("cpu")), TorchBufferOps)


def test_discovery_imports_neither_warp_nor_the_kernels():
    code = (
        "import sys; from alchemi_core import registry; registry.plugins(); registry.available();"
        "bad = [m for m in ('warp', 'alchemi_warp.kernels', 'alchemi_warp.buffer_ops') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
