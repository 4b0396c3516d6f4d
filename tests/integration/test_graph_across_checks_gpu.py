"""On a GPU: a captured step outlives the checks that move systems between stages.

Relaxations converge at different checks. Each such check rewrites the masks in place, and the
engine rebuilds in place what the integrators derived from them (``StepContext.derived``), so the
graph captured at the start keeps replaying, and the run ends exactly where the eager run ends.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.dynamics import ConvergenceHook, FusedStage
from alchemi_core.testing import rattled_argon

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = torch.device("cuda")


def _cells(n: int = 6) -> Batch:
    cells = rattled_argon(n, 0.02, 0.03)  # different starts: they converge at different steps
    return Batch.from_atoms(cells, dtype=torch.float64).to(CUDA)


def _model() -> Any:
    return registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5125)


def _fire() -> Any:
    return registry.build("integrator:fire", model=_model(), n_steps=400, dt=5.0, dt_max=50.0,
                          convergence_hook=ConvergenceHook.from_fmax(1e-3, frequency=1))


def _relaxed(stage: Any, compiled: bool) -> tuple[Batch, Any]:
    batch = _cells()
    if compiled:
        stage = stage.compile()
    with stage:
        stage.run(batch)
    torch.cuda.synchronize()
    return batch, stage


def test_fire_keeps_its_graph_while_systems_converge() -> None:
    eager, _ = _relaxed(_fire(), compiled=False)
    graphed, stage = _relaxed(_fire(), compiled=True)
    assert eager.status.tolist() == [1] * 6
    fire_steps = eager.fire_steps.tolist()
    # The systems converged at several different checks, and the graph was captured once.
    assert len(set(fire_steps)) >= 3
    assert stage._engine.state.graph_captures == 1
    assert graphed.status.tolist() == eager.status.tolist()
    assert graphed.fire_steps.tolist() == fire_steps
    torch.testing.assert_close(graphed.positions, eager.positions, rtol=0, atol=1e-9)


def test_fused_relax_then_md_keeps_its_graph_and_matches_eager() -> None:
    """Systems leave FIRE for velocity Verlet one check at a time; each arrival sets that stage's
    velocities (``init_state``) in place, and the replayed step integrates it from then on."""

    def fused() -> FusedStage:
        relax = _fire()
        md = registry.build("integrator:velocity-verlet", model=_model(), n_steps=30, dt=2.0,
                            initial_temperature=20.0, random_seed=3)
        return FusedStage([(0, relax), (1, md)])

    eager, _ = _relaxed(fused(), compiled=False)
    graphed, stage = _relaxed(fused(), compiled=True)
    assert eager.status.tolist() == graphed.status.tolist() == [2] * 6
    assert stage._engine.state.graph_captures == 1
    torch.testing.assert_close(graphed.velocities, eager.velocities, rtol=0, atol=1e-9)
    torch.testing.assert_close(graphed.positions, eager.positions, rtol=0, atol=1e-9)


def test_a_structure_that_fails_leaves_a_masked_captured_step_in_place() -> None:
    """System 2's forces are NaN from the start: quarantined at the first check, the step captured
    before it keeps replaying (it reads the rewritten masks, so system 2 no longer steps), and the
    others relax as in the eager run."""
    from alchemi_core.testing.exploding import ExplodingModel

    def fire() -> Any:
        return registry.build("integrator:fire", model=ExplodingModel(_model(), explode=[2]), n_steps=400,
                              dt=5.0, dt_max=50.0,
                              convergence_hook=ConvergenceHook.from_fmax(1e-3, frequency=1))

    eager, eager_stage = _relaxed(fire(), compiled=False)
    graphed, stage = _relaxed(fire(), compiled=True)
    assert stage._engine.state.graph_captures == 1
    assert [(q.system_id, q.step) for q in stage.quarantined] == \
        [(q.system_id, q.step) for q in eager_stage.quarantined] == [(2, 0)]
    assert graphed.status.tolist() == eager.status.tolist()
    assert graphed.status[2].item() < 0 and graphed.status.tolist().count(1) == 5
    others = graphed.batch_idx != 2
    torch.testing.assert_close(graphed.positions[others], eager.positions[others], rtol=0, atol=1e-9)


def test_a_structure_that_fails_in_unmasked_md_has_the_step_captured_again_masked() -> None:
    """Langevin MD steps every system unmasked until a health check finds system 1's NaN: the look
    at step 99 is read at the next one (199, the GPU's queue does not drain for it), which retires
    the unmasked graph; step 200 is captured again with masks, and the others run on."""
    from alchemi_core.testing.exploding import ExplodingModel

    batch = _cells(3)
    stage = registry.build("integrator:langevin", model=ExplodingModel(_model(), explode=[1]), n_steps=250,
                           dt=2.0, temperature=50.0, friction=0.01, random_seed=0).compile()
    with stage:
        stage.run(batch)
    torch.cuda.synchronize()
    assert [(q.system_id, q.step) for q in stage.quarantined] == [(1, 99)]
    assert stage._engine.state.graph_captures == 2
    assert batch.status.tolist()[0] == 0 and batch.status.tolist()[2] == 0 and batch.status.tolist()[1] < 0
    others = batch.batch_idx != 1
    assert bool(torch.isfinite(batch.positions[others]).all())


def test_fused_relax_then_langevin_with_the_com_held_matches_eager() -> None:
    """Langevin with the centre of mass held, after FIRE in one fused stage: while systems still
    relax, Langevin's kernels meet idle systems; the replayed graph ends where the eager run ends."""
    langevins = []

    def fused() -> FusedStage:
        md = registry.build("integrator:langevin", model=_model(), n_steps=30, dt=2.0, temperature=40.0,
                            friction=0.02, random_seed=5, fix_com=True)
        langevins.append(md)
        return FusedStage([(0, _fire()), (1, md)])

    eager, _ = _relaxed(fused(), compiled=False)
    graphed, stage = _relaxed(fused(), compiled=True)
    assert eager.status.tolist() == graphed.status.tolist() == [2] * 6
    assert stage._engine.state.graph_captures == 1
    torch.testing.assert_close(graphed.velocities, eager.velocities, rtol=0, atol=1e-9)
    torch.testing.assert_close(graphed.positions, eager.positions, rtol=0, atol=1e-9)
    # Each system's centre of mass stays where FIRE's last velocities left it: the noise adds none.
    mass = graphed.atomic_masses.reshape(-1, 1)
    momentum = torch.zeros(6, 3, dtype=graphed.velocities.dtype, device=CUDA)
    momentum.index_add_(0, graphed.batch_idx, graphed.velocities * mass)
    assert momentum.abs().max().item() < 1e-9
