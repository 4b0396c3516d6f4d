"""GPU behaviour of the engine: CUDA-graph capture, streams, no allocation per step.

Marked ``gpu``: they run on the GPU machine (``pytest -m gpu``) and skip elsewhere.
"""

from __future__ import annotations

import pytest
import torch

from alchemi_core.dynamics import ConvergenceHook, DemoDynamics
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import make_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_batch_operations_on_the_gpu_keep_every_dtype():
    from alchemi_core.data import Batch
    from alchemi_core.testing.contracts import assert_same_systems

    src = make_batch([3, 4, 5], edges=True, extras=True).to("cuda")
    buf = Batch.empty(num_systems=4, num_nodes=20, num_edges=20, template=src)
    mask = torch.tensor([True, False, True], device="cuda")
    assert buf.put(src, mask) == 2
    assert_same_systems(src.index_select(mask), buf)
    src.defrag()
    assert src.system_id.tolist() == [1]


def test_compiled_fused_stage_matches_eager_and_captures_once_per_composition():
    model = DemoModelWrapper()

    def stages():
        opt = DemoDynamics(model=model, n_steps=30, dt=0.5,
                           convergence_hook=ConvergenceHook.from_fmax(1e-6, frequency=10))
        md = DemoDynamics(model=model, n_steps=40, dt=0.5)
        return opt + md

    eager_batch = make_batch([5, 7, 6], dtype=torch.float64).to("cuda")
    graph_batch = eager_batch.clone()
    stages().run(eager_batch)
    fused = stages().compile(mode="reduce-overhead")
    with fused:
        fused.run(graph_batch)
    torch.testing.assert_close(graph_batch.positions, eager_batch.positions)
    assert 1 <= fused._engine.graph_captures <= 3


def _allocations_in_steps(dyn: DemoDynamics, batch, steps: int = 50) -> int:
    """Device allocations (caching allocator) of ``steps`` engine steps after a 5-step run."""
    dyn.run(batch, n_steps=5)
    engine = dyn._engine
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(steps):
        engine.step()
    torch.cuda.synchronize()
    return torch.cuda.memory_stats()["allocation.all.allocated"] - before


def test_steps_allocate_no_device_memory_once_running():
    batch = make_batch([8, 8], dtype=torch.float32).to("cuda")
    per_step = _allocations_in_steps(DemoDynamics(model=DemoModelWrapper(), n_steps=1000, dt=0.5), batch) / 50
    # Eager torch still allocates temporaries from its caching allocator (no cudaMalloc);
    # a captured step allocates nothing at all.
    graphed = DemoDynamics(model=DemoModelWrapper(), n_steps=1000, dt=0.5).compile()
    assert _allocations_in_steps(graphed, batch) == 0
    assert per_step < 40


def test_context_manager_runs_on_its_own_stream():
    seen = []

    class StreamProbe:
        from alchemi_core.dynamics import DynamicsStage

        stage = DynamicsStage.AFTER_STEP
        frequency = 1

        def __call__(self, batch, dynamics):
            seen.append(torch.cuda.current_stream())

    dyn = DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5, hooks=[StreamProbe()])
    with dyn:
        dyn.run(make_batch([4]).to("cuda"))
        own = dyn._stream
    assert own is not None and all(s == own for s in seen)
    assert seen[0] != torch.cuda.default_stream()
