"""On a GPU: checks that queue the next step before their read-back (``CoreTuning.run_ahead``) and a
captured step that rewrites the masks at its start (``CoreTuning.masks_in_step``), both on for CUDA,
alone or together, end a captured relaxation where the run that does neither ends, and a
structure that fails is quarantined at the same check."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.dynamics import ConvergenceHook, masks
from alchemi_core.testing import rattled_argon
from alchemi_core.testing.exploding import ExplodingModel
from alchemi_core.tuning import CoreTuning

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = torch.device("cuda")


#: (run ahead, masks in the step) against (False, False).
MODES = [(True, False), (False, True), (True, True)]


def _relaxed(mode: tuple[bool, bool], monkeypatch: pytest.MonkeyPatch,
             explode: list[int] | None = None) -> tuple[Batch, Any]:
    tuning = CoreTuning(run_ahead=mode[0], masks_in_step=mode[1], force_max_kernel=True)
    cells = rattled_argon(8, 0.05, 0.02, repeats=((2, 2, 2), (3, 2, 2)))  # different starts: different checks
    batch = Batch.from_atoms(cells, dtype=torch.float64).to(CUDA)
    model: Any = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5125)
    if explode:
        # NaN from the first call: a captured step calls the model's Python once, at its capture.
        model = ExplodingModel(model, explode=explode)
    fire = registry.build("integrator:fire", model=model, n_steps=400, dt=5.0, dt_max=50.0,
                          convergence_hook=ConvergenceHook.from_fmax(1e-3, frequency=1), tuning=tuning).compile()
    writes: list[int] = []
    original = masks.Masks.write_in_step
    monkeypatch.setattr(masks.Masks, "write_in_step", lambda self, batch: (writes.append(1), original(self, batch)))
    with fire:
        fire.run(batch)
    torch.cuda.synchronize()
    monkeypatch.setattr(masks.Masks, "write_in_step", original)
    # Captured with the step where asked (the warm-up and the capture call it; replays do not).
    assert (len(writes) > 0) == mode[1]
    return batch, fire


@pytest.mark.parametrize("mode", MODES)
def test_a_captured_relaxation_run_ahead_ends_where_the_one_that_waits_ends(
        mode: tuple[bool, bool], monkeypatch: pytest.MonkeyPatch) -> None:
    """The same systems stop after the same steps, at the same positions (to the rounding of
    FIRE's per-system sums, added in no fixed order on a GPU), the step captured once."""
    waited, fire_w = _relaxed((False, False), monkeypatch)
    ahead, fire_a = _relaxed(mode, monkeypatch)
    assert fire_w._engine.state.steps_run_ahead == 0
    # Every check ran the next step ahead, where asked.
    assert fire_a._engine.state.steps_run_ahead == (fire_a.step_count if mode[0] else 0)
    assert fire_a.step_count == fire_w.step_count
    assert fire_a._engine.state.graph_captures == 1
    assert ahead.status.tolist() == waited.status.tolist() == [1] * 8
    assert len(set(ahead.fire_steps.tolist())) >= 3
    assert ahead.fire_steps.tolist() == waited.fire_steps.tolist()
    torch.testing.assert_close(ahead.positions, waited.positions, rtol=0, atol=1e-7)
    assert bool((ahead.velocities == 0).all())  # relaxed structures leave FIRE at rest


@pytest.mark.parametrize("mode", MODES)
def test_a_failing_structure_is_quarantined_at_the_same_check_and_the_others_relax(
        mode: tuple[bool, bool], monkeypatch: pytest.MonkeyPatch) -> None:
    waited, fire_w = _relaxed((False, False), monkeypatch, explode=[3])
    ahead, fire_a = _relaxed(mode, monkeypatch, explode=[3])
    assert (fire_a._engine.state.steps_run_ahead > 0) == mode[0]
    assert fire_a._engine.state.graph_captures == 1
    assert [(q.system_id, q.step, q.reason) for q in fire_a.quarantined] == \
        [(q.system_id, q.step, q.reason) for q in fire_w.quarantined]
    assert len(fire_a.quarantined) == 1 and ahead.status[3].item() < 0
    assert ahead.status.tolist() == waited.status.tolist()
    rows = ahead.batch_idx != 3
    torch.testing.assert_close(ahead.positions[rows], waited.positions[rows], rtol=0, atol=1e-7)
