"""model:sevennet on a GPU: equal to SevenNetCalculator; the captured step equals the eager one and
allocates nothing; FIRE then Langevin runs."""

from __future__ import annotations

import pytest
import torch

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.testing.gpu import eager_and_captured, langevin, step_allocations
from alchemi_potentials.cueq import cueq_kernels_installed
from alchemi_potentials.testing import (
    compare_with_calculator,
    copper_cells,
    reference_structures,
    relax_then_md,
)

pytestmark = pytest.mark.gpu


def test_gpu_equals_sevennet_calculator(seven_net):
    """The default model: on cuEquivariance's kernels where they are installed, else e3nn's."""
    from sevenn.calculator import SevenNetCalculator

    calc = SevenNetCalculator("7net-0", device="cuda")
    compare_with_calculator(seven_net, calc, reference_structures(), torch.float32, energy_tol=2e-4,
                            force_tol=2e-5, stress_tol=1e-6, device="cuda")
    assert seven_net.uses_cueq == cueq_kernels_installed()


def test_e3nn_on_the_gpu_equals_sevennet_calculator():
    from alchemi_sevennet import SevenNetModel
    from sevenn.calculator import SevenNetCalculator

    model = SevenNetModel("7net-0", enable_cueq=False)
    calc = SevenNetCalculator("7net-0", device="cuda")
    compare_with_calculator(model, calc, reference_structures(), torch.float32, energy_tol=2e-4,
                            force_tol=2e-5, stress_tol=1e-6, device="cuda")
    assert not model.uses_cueq


def test_the_captured_step_replays_what_the_eager_step_does(seven_net):
    eager, graphed, captures = eager_and_captured(seven_net, Batch.from_atoms(copper_cells(4), dtype=torch.float32,
                                                                                device="cuda"))
    assert captures == 1
    torch.testing.assert_close(graphed.positions, eager.positions, rtol=0, atol=1e-5)
    torch.testing.assert_close(graphed.forces, eager.forces, rtol=0, atol=1e-4)


def test_captured_steps_allocate_nothing(seven_net):
    stage = langevin(seven_net, 1000).compile()
    assert step_allocations(stage, Batch.from_atoms(copper_cells(4), dtype=torch.float32, device="cuda")) == (0, 0)
    # One capture in the warm-up run, one after it (a finished run drops its graph); none while
    # the steps were counted.
    assert stage._engine.state.graph_captures == 2


@pytest.mark.parametrize("inflight", [False, True], ids=["fused", "inflight"])
def test_fire_then_langevin(seven_net, inflight):
    relax_then_md(seven_net, copper_cells(3) + reference_structures()[:2], torch.float32, inflight=inflight,
                  fire_steps=40, md_steps=40, device="cuda", compiled=True)


def test_sevennet_plus_d3_on_the_gpu(seven_net):
    pytest.importorskip("torch_dftd")
    total = registry.build("model:sum", parts=[seven_net, {"component": "model:d3"}])
    out = total(Batch.from_atoms(copper_cells(2), dtype=torch.float32, device="cuda"), compute_stress=True)
    assert torch.isfinite(out["forces"]).all() and torch.isfinite(out["stress"]).all()


def test_cueq_kernels_equal_sevennet_calculator():
    """7net-0 on cuEquivariance's kernels gives SevenNet's e3nn results (its calculator, GPU)."""
    if not cueq_kernels_installed():
        pytest.skip("needs cuequivariance-torch with its CUDA kernels")
    from alchemi_sevennet import SevenNetModel
    from sevenn.calculator import SevenNetCalculator

    model = SevenNetModel("7net-0", enable_cueq=True)
    assert model.uses_cueq
    calc = SevenNetCalculator("7net-0", device="cuda")
    compare_with_calculator(model, calc, reference_structures(), torch.float32, energy_tol=2e-4, force_tol=2e-5,
                            stress_tol=1e-6, device="cuda")
