"""GPUBuffer as the sink of an inflight-batching run: every structure arrives exactly once, whole."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import ConvergenceHook, DemoDynamics, SizeAwareSampler
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import random_structures
from alchemi_warp.buffer_ops import WarpBufferOps
from alchemi_warp.gpu_buffer import GPUBuffer

SIZES = [3, 5, 4, 2, 6, 3, 4, 5, 2, 3]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_every_structure_lands_in_the_buffer_once(device):
    structures = random_structures(SIZES, extras=True)
    # The run happens on `device` (the GPU host has no Warp CPU compiler, so nothing may fall back to it).
    sampler = SizeAwareSampler(ListDataset(structures, device=device), max_atoms=14, max_edges=None, max_batch_size=4, bin_width=2)
    # On the CPU, the sink's copies run the Warp kernels (on CUDA they are core's choice anyway).
    ops = WarpBufferOps(allow_cpu=True, every_op=True) if device == "cpu" else None
    sink = GPUBuffer(capacity=len(SIZES), max_atoms=max(SIZES), max_edges=0, device=device, ops=ops)
    dynamics = DemoDynamics(
        model=DemoModelWrapper(),
        n_steps=30,
        dt=0.5,
        sampler=sampler,
        sinks=[sink],
        convergence_hook=ConvergenceHook.from_fmax(0.5),
    )
    assert dynamics.run() is None  # with a sampler and sinks, the results are in the sinks
    assert sink.is_full()
    stored = sink.read()
    ids = stored.system_id.tolist()
    assert sorted(ids) == list(range(len(SIZES)))
    for row, i in enumerate(ids):
        system = stored[row]
        assert system.num_nodes == SIZES[i]
        assert torch.equal(system.atomic_numbers.cpu(), structures[i].atomic_numbers)  # int64 kept
        assert torch.equal(system.frozen.cpu(), structures[i].frozen)  # bool kept
        assert system.tag.dtype == torch.int32 and system.tag.item() == i
