"""MaxForceClampHook: norms capped, directions kept, only the stage's atoms, before first use."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from alchemi_core.dynamics import DemoDynamics, FusedStage, StepContext
from alchemi_core.errors import ConfigurationError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.units import ACCELERATION
from alchemi_hooks.clamp import MaxForceClampHook


def _with_forces(batch, scale=20.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    batch.set_field("forces", torch.randn(batch.num_nodes, 3, generator=g) * scale, "node")
    return batch


def test_norms_are_capped_and_directions_kept(molecules):
    batch = _with_forces(molecules([4, 6]), scale=8.0)
    before = batch.forces.clone()
    MaxForceClampHook(max_force=10.0)(batch, SimpleNamespace(context=StepContext.standalone(batch, system_mask=None)))
    norms_before = before.norm(dim=1)
    norms = batch.forces.norm(dim=1)
    assert (norms_before > 10).any() and (norms_before < 10).any()
    assert torch.allclose(norms, norms_before.clamp(max=10.0), rtol=1e-6)
    cosine = (batch.forces * before).sum(dim=1) / (norms * norms_before)
    assert torch.allclose(cosine, torch.ones_like(cosine), atol=1e-6)
    small = norms_before <= 10
    assert torch.equal(batch.forces[small], before[small])  # untouched, bit for bit


def test_zero_forces_stay_zero(molecules):
    batch = molecules([3])
    batch.set_field("forces", torch.zeros(3, 3), "node")
    MaxForceClampHook(max_force=1.0)(batch, SimpleNamespace(context=StepContext.standalone(batch, system_mask=None)))
    assert torch.equal(batch.forces, torch.zeros(3, 3))


def test_only_the_stage_systems_are_clamped(molecules):
    batch = _with_forces(molecules([4, 6, 5]))
    before = batch.forces.clone()
    stage = SimpleNamespace(context=StepContext.standalone(batch, system_mask=torch.tensor([False, True, False])))
    MaxForceClampHook(max_force=5.0)(batch, stage)
    inside = batch.batch_idx == 1
    assert torch.equal(batch.forces[~inside], before[~inside])
    assert batch.forces[inside].norm(dim=1).max() <= 5.0 + 1e-5


def test_first_step_uses_clamped_forces_from_a_rough_start(molecule):
    """Velocity Verlet from overlapping atoms: both half-kicks must see capped forces."""
    from alchemi_core.data import Batch

    data = molecule(4, seed=3, speed=0.0)
    batch = Batch.from_data_list([data])
    batch.positions[1] = batch.positions[0] + torch.tensor([0.05, 0.0, 0.0])  # near overlap
    cap, dt = 0.5, 0.5
    model = DemoModelWrapper()
    f0 = model(batch)["forces"]
    assert f0.norm(dim=1).max() > 5 * cap

    def capped(f):
        n = f.norm(dim=1, keepdim=True)
        return f * (cap / n.clamp(min=cap))

    DemoDynamics(model=model, n_steps=1, dt=dt, hooks=[MaxForceClampHook(max_force=cap)]).run(batch)
    inv_m = (ACCELERATION / batch.atomic_masses).unsqueeze(-1)
    x0 = Batch.from_data_list([data]).positions.clone()
    x0[1] = x0[0] + torch.tensor([0.05, 0.0, 0.0])
    v_half = 0.5 * dt * capped(f0) * inv_m
    x1 = x0 + dt * v_half
    ref = Batch.from_data_list([data])
    ref.positions.copy_(x1)
    f1 = capped(model(ref)["forces"])
    v1 = v_half + 0.5 * dt * f1 * inv_m
    assert torch.allclose(batch.positions, x1, atol=1e-6)
    assert torch.allclose(batch.velocities, v1, atol=1e-6)
    assert batch.forces.norm(dim=1).max() <= cap + 1e-6


def test_in_a_fused_stage_only_the_md_stage_is_clamped(molecules):
    batch = molecules([4, 5, 6, 3])
    batch.set_field("status", torch.tensor([0, 1, 0, 1]), "system")
    opt = DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5)
    md = DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5, hooks=[MaxForceClampHook(max_force=1e-3)])
    fused = FusedStage([(0, opt), (1, md)])
    seen = []

    class Look:
        stage = md.hooks[0].stage
        frequency = 1

        def __call__(self, b, d):
            seen.append((b.forces.norm(dim=1).clone(), b.batch_idx.clone(), b.status.clone()))

    md.hooks.append(Look())
    fused.run(batch)
    norms, idx, status = seen[0]
    in_md = status[idx] == 1
    assert norms[in_md].max() <= 1e-3 + 1e-9
    assert norms[~in_md].min() > 1e-2  # stage-0 systems keep their forces


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_rejects_a_cap_that_is_not_positive_and_finite(bad):
    with pytest.raises(ConfigurationError, match="max_force"):
        MaxForceClampHook(max_force=bad)
