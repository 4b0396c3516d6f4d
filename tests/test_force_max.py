"""Each system's largest force norm in the Warp kernel of ``dynamics.force_max``, against torch."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.dynamics.force_max import system_force_max

pytest.importorskip("warp")


def _torch_max(forces: torch.Tensor, system: torch.Tensor, n: int) -> torch.Tensor:
    norms = torch.linalg.vector_norm(forces, dim=-1)
    return forces.new_zeros(n).scatter_reduce_(0, system, norms, reduce="amax", include_self=False)


@pytest.mark.parametrize("largest", [5, 90])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_each_systems_largest_norm_is_torchs(dtype, largest):
    """Systems smaller than a thread's run of atoms (several per thread) and larger (several
    threads per system), the largest force anywhere in a system; equal to torch's to the last bit
    or two of the norm."""
    g = torch.Generator().manual_seed(7)
    sizes = torch.randint(1, largest + 1, (80,), generator=g)
    system = torch.repeat_interleave(torch.arange(80), sizes)
    forces = torch.randn(int(sizes.sum()), 3, generator=g, dtype=dtype)
    # Each system's largest force at a random place: its first, last or a middle atom.
    starts = torch.cumsum(sizes, 0) - sizes
    picks = starts + (torch.rand(80, generator=g) * sizes).long()
    forces[picks] *= 10.0
    out = torch.full((80,), -1.0, dtype=dtype)
    assert system_force_max(forces, system, out)
    torch.testing.assert_close(out, _torch_max(forces, system, 80), rtol=4 * torch.finfo(dtype).eps, atol=0)


def test_a_system_with_a_non_finite_force_gets_infinity_and_the_others_their_own():
    forces = torch.ones(40, 3)
    system = torch.repeat_interleave(torch.arange(4), torch.tensor([7, 20, 3, 10]))
    forces[9, 1] = float("nan")  # system 1
    forces[35, 0] = -float("inf")  # system 3
    out = torch.zeros(4)
    assert system_force_max(forces, system, out)
    assert out[[1, 3]].tolist() == [float("inf")] * 2
    torch.testing.assert_close(out[[0, 2]], torch.full((2,), 3.0**0.5))


def test_other_layouts_are_left_to_torch():
    """Wrong dtypes or shapes: nothing written, False (the caller measures in torch)."""
    system = torch.zeros(4, dtype=torch.int64)
    out = torch.full((1,), 7.0)
    assert not system_force_max(torch.ones(4, 3, dtype=torch.float64), system, out)  # out is float32
    assert not system_force_max(torch.ones(4, 2), system, out)
    assert not system_force_max(torch.ones(4, 3), system.int(), out)
    assert out.tolist() == [7.0]


def test_a_relaxation_converges_where_torchs_fmax_says(monkeypatch):
    """FIRE to 0.05 eV/Å (float32, checks every step) with the kernel and with torch's measure:
    the same systems converge after the same steps, to the same positions, below the threshold."""
    pytest.importorskip("alchemi_potentials")
    from alchemi_core import registry
    from alchemi_core.data import Batch
    from alchemi_core.dynamics import ConvergenceHook, checks
    from alchemi_core.testing import rattled_argon
    from alchemi_core.tuning import CoreTuning

    def relaxed(kernel: bool) -> Batch:
        cells = rattled_argon(5, 0.05, 0.02, repeats=((2, 2, 2), (3, 2, 2)))  # different starts: different steps
        batch = Batch.from_atoms(cells, dtype=torch.float32)
        model = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5125)
        fire = registry.build("integrator:fire", model=model, n_steps=400, dt=5.0, dt_max=50.0,
                              convergence_hook=ConvergenceHook.from_fmax(0.05, frequency=1),
                              tuning=CoreTuning(run_ahead=False, masks_in_step=False, force_max_kernel=kernel))
        fire.run(batch)
        return batch

    measured: list[bool] = []

    def counted(*args: object) -> bool:
        measured.append(system_force_max(*args))
        return measured[-1]

    monkeypatch.setattr(checks, "system_force_max", counted)
    kernel = relaxed(True)
    assert measured and all(measured)  # every check measured with the kernel
    measured.clear()
    reference = relaxed(False)
    assert not measured  # the tuning without the kernel measures in torch
    assert kernel.status.tolist() == reference.status.tolist() == [1] * 5
    assert len(set(kernel.fire_steps.tolist())) >= 3
    assert kernel.fire_steps.tolist() == reference.fire_steps.tolist()
    torch.testing.assert_close(kernel.positions, reference.positions, rtol=0, atol=0)
    assert bool((kernel.fmax <= 0.05).all())
    torch.testing.assert_close(kernel.fmax, reference.fmax, rtol=1e-6, atol=0)
