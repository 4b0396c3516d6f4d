"""model:sevennet on a GPU: equal to SevenNetCalculator, eager steps take no new memory, runs."""

from __future__ import annotations

import pytest
import torch

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_potentials.testing import (
    compare_with_calculator,
    copper_cells,
    reference_structures,
    relax_then_md,
)

pytestmark = pytest.mark.gpu


def test_gpu_equals_sevennet_calculator(seven_net):
    from sevenn.calculator import SevenNetCalculator

    calc = SevenNetCalculator("7net-0", device="cuda")
    compare_with_calculator(seven_net, calc, reference_structures(), torch.float32, energy_tol=2e-4,
                            force_tol=2e-5, stress_tol=1e-6, device="cuda")


def test_a_compiled_stage_steps_sevennet_eagerly_without_new_memory(seven_net):
    stage = registry.build("integrator:langevin", model=seven_net, n_steps=1000, dt=1.0, temperature=300.0,
                           friction=0.01, initial_temperature=300.0, random_seed=0).compile()
    batch = Batch.from_atoms(copper_cells(4), dtype=torch.float32, device="cuda")
    stage.run(batch, n_steps=5)
    engine = stage._engine
    assert not engine.graph_requested and engine.graph_captures == 0
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["segment.all.allocated"]
    for _ in range(20):
        engine.step()
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["segment.all.allocated"] == before


@pytest.mark.parametrize("inflight", [False, True], ids=["fused", "inflight"])
def test_fire_then_langevin(seven_net, inflight):
    relax_then_md(seven_net, copper_cells(3) + reference_structures()[:2], torch.float32, inflight=inflight,
                  fire_steps=40, md_steps=40, device="cuda", compiled=True)


def test_sevennet_plus_d3_on_the_gpu(seven_net):
    pytest.importorskip("torch_dftd")
    total = registry.build("model:sum", models=[seven_net, {"model": "model:d3"}])
    out = total(Batch.from_atoms(copper_cells(2), dtype=torch.float32, device="cuda"), compute_stress=True)
    assert torch.isfinite(out["forces"]).all() and torch.isfinite(out["stress"]).all()
