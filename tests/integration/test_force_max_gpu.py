"""On a GPU: each system's largest force norm from the Warp kernel of ``dynamics.force_max``,
against torch, alone and inside a captured check."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.dynamics import ConvergenceHook, checks
from alchemi_core.dynamics.force_max import system_force_max
from alchemi_core.testing import rattled_argon
from alchemi_core.tuning import CoreTuning

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = torch.device("cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_each_systems_largest_norm_on_the_gpu_is_torchs(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(11)
    sizes = torch.randint(1, 300, (500,), generator=g)
    system = torch.repeat_interleave(torch.arange(500), sizes).to(CUDA)
    forces = torch.randn(int(sizes.sum()), 3, generator=g, dtype=dtype).to(CUDA)
    out = torch.full((500,), -1.0, dtype=dtype, device=CUDA)
    assert system_force_max(forces, system, out)
    norms = torch.linalg.vector_norm(forces, dim=-1)
    expected = torch.zeros_like(out).scatter_reduce_(0, system, norms, reduce="amax", include_self=False)
    torch.testing.assert_close(out, expected, rtol=4 * torch.finfo(dtype).eps, atol=0)


def _relaxed(kernel: bool) -> tuple[Batch, Any]:
    tuning = attrs.evolve(CoreTuning.for_device(CUDA), force_max_kernel=kernel)
    cells = rattled_argon(8, 0.05, 0.02, repeats=((2, 2, 2), (3, 2, 2)))  # different starts: different checks
    batch = Batch.from_atoms(cells, dtype=torch.float32).to(CUDA)
    model = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5125)
    fire = registry.build("integrator:fire", model=model, n_steps=400, dt=5.0, dt_max=50.0,
                          convergence_hook=ConvergenceHook.from_fmax(0.05, frequency=1), tuning=tuning).compile()
    with fire:
        fire.run(batch)
    torch.cuda.synchronize()
    return batch, fire


def test_a_captured_relaxation_converges_where_torchs_measure_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """FIRE with its step and checks captured: the kernel's fmax and torch's stop the same
    systems after the same steps, at the same positions (to the rounding of FIRE's per-system
    sums, whose atomic adds come in no fixed order on a GPU: 1.5e-8 Å seen), below the threshold."""
    measured: list[bool] = []

    def counted(*args: Any) -> bool:
        measured.append(system_force_max(*args))
        return measured[-1]

    monkeypatch.setattr(checks, "system_force_max", counted)
    reference, _ = _relaxed(kernel=False)
    assert not measured  # torch measured every check
    measured.clear()
    batch, fire = _relaxed(kernel=True)
    assert measured and all(measured)  # the kernel did (captured: later checks replay it)
    assert fire._engine.state.graph_captures == 1
    assert batch.status.tolist() == reference.status.tolist() == [1] * 8
    assert len(set(batch.fire_steps.tolist())) >= 3
    assert batch.fire_steps.tolist() == reference.fire_steps.tolist()
    torch.testing.assert_close(batch.positions, reference.positions, rtol=0, atol=1e-6)
    assert bool((batch.fmax <= 0.05).all())
