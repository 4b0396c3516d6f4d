"""Checks that queue the next step before their read-back (``CoreTuning.run_ahead``), and steps that
rewrite the masks at their start (``CoreTuning.masks_in_step``), alone or together, give the run that
does neither, to the last bit: FIRE relaxations converging at different checks, a structure that
fails, a step budget, hooks after the step. Runs where something the host does after a check
would change the next step do not run ahead.

On a CPU nothing overlaps (the host does the device work itself), so both are off there by
default; these tests pass a tuning that switches them on to compare the orders of the same work.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.dynamics import ConvergenceHook, DynamicsStage, FusedStage, Hook, masks
from alchemi_core.testing import rattled_argon
from alchemi_core.testing.exploding import ExplodingModel
from alchemi_core.tuning import CoreTuning

pytest.importorskip("warp")


def _cells(n: int = 6) -> Batch:
    cells = rattled_argon(n, 0.03, 0.02, repeats=((2, 2, 2), (3, 2, 2)))  # they converge at different checks
    return Batch.from_atoms(cells, dtype=torch.float64)


def _lj() -> Any:
    return registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5125)


def _tuning(ahead: bool, in_step: bool = False) -> CoreTuning:
    return CoreTuning(run_ahead=ahead, masks_in_step=in_step, force_max_kernel=True)


def _fire(model: Any = None, n_steps: int = 400, hooks: tuple[Any, ...] = (), tuning: CoreTuning | None = None,
          **conv: Any) -> Any:
    return registry.build("integrator:fire", model=model or _lj(), n_steps=n_steps, dt=5.0, dt_max=50.0,
                          hooks=list(hooks), convergence_hook=ConvergenceHook.from_fmax(1e-3, frequency=1, **conv),
                          tuning=tuning)


#: (run ahead, masks in the step): each way of running against the run that does neither.
MODES = [(True, False), (False, True), (True, True)]


#: The engine's own mask rewrite, which :func:`_switch` wraps to count its calls.
_WRITE_MASKS = masks.Masks.write_in_step


def _count_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The list that gets one entry per rewrite of the masks in a step."""
    writes: list[int] = []
    monkeypatch.setattr(masks.Masks, "write_in_step", lambda self, batch: (writes.append(1), _WRITE_MASKS(self, batch)))
    return writes


def _run(make: Any, ahead: bool, monkeypatch: pytest.MonkeyPatch, in_step: bool = False,
         **run: Any) -> tuple[Batch, Any]:
    writes = _count_writes(monkeypatch)
    stage = make()
    stage.tuning = _tuning(ahead, in_step)
    batch = _cells()
    stage.run(batch, **run)
    stage.masks_written_in_step = len(writes)
    assert (len(writes) > 0) == in_step  # the mode applied where it was asked for
    return batch, stage


def _same(a: Batch, b: Batch) -> None:
    """Every field of the two batches equal to the last bit."""
    keys = sorted(a.keys())
    assert keys == sorted(b.keys())
    for key in keys:
        x, y = getattr(a, key), getattr(b, key)
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y), key


@pytest.mark.parametrize("mode", MODES)
def test_a_relaxation_run_ahead_ends_where_the_one_that_waits_ends(
        mode: tuple[bool, bool], monkeypatch: pytest.MonkeyPatch) -> None:
    waited, stage_w = _run(_fire, False, monkeypatch)
    ahead, stage_a = _run(_fire, mode[0], monkeypatch, in_step=mode[1])
    assert stage_w._engine.state.steps_run_ahead == 0
    # Every check (the last one too) queued the next step before its read-back.
    assert stage_a._engine.state.steps_run_ahead == (stage_a.step_count if mode[0] else 0)
    # Each step rewrote the masks at its start (the one queued after the last check too).
    assert stage_a.masks_written_in_step == (stage_a.step_count + mode[0] if mode[1] else 0)
    assert stage_a.step_count == stage_w.step_count
    assert ahead.status.tolist() == [1] * 6
    assert len(set(ahead.fire_steps.tolist())) >= 3  # the systems converged at different checks
    _same(ahead, waited)


@pytest.mark.parametrize("mode", MODES)
def test_a_step_budget_stops_both_runs_at_the_same_step(mode: tuple[bool, bool], monkeypatch: pytest.MonkeyPatch) -> None:
    """The run stops at ``n_steps`` with systems left: no step is queued past it."""
    waited, stage_w = _run(lambda: _fire(n_steps=25), False, monkeypatch)
    ahead, stage_a = _run(lambda: _fire(n_steps=25), mode[0], monkeypatch, in_step=mode[1])
    assert stage_a.step_count == stage_w.step_count == 25
    assert 0 in ahead.status.tolist()  # some system was still relaxing
    assert stage_a._engine.state.steps_run_ahead == (24 if mode[0] else 0)
    _same(ahead, waited)


@pytest.mark.parametrize("mode", MODES)
def test_a_structure_that_fails_is_quarantined_at_the_same_step(
        mode: tuple[bool, bool], monkeypatch: pytest.MonkeyPatch) -> None:
    """System 2's forces turn NaN: quarantined at the same check with the same record, and the
    others relax as in the run that waits (the failed one does not step ahead)."""
    def make() -> Any:
        return _fire(model=ExplodingModel(_lj(), explode=[2], after=6))

    waited, stage_w = _run(make, False, monkeypatch)
    ahead, stage_a = _run(make, mode[0], monkeypatch, in_step=mode[1])
    assert (stage_a._engine.state.steps_run_ahead > 0) == mode[0]
    assert [(q.system_id, q.step, q.reason) for q in stage_a.quarantined] == \
        [(q.system_id, q.step, q.reason) for q in stage_w.quarantined]
    assert len(stage_a.quarantined) == 1 and ahead.status[2].item() < 0
    rows = ahead.batch_idx != 2
    for key in ("positions", "velocities"):
        assert torch.equal(getattr(ahead, key)[rows], getattr(waited, key)[rows]), key
    torch.testing.assert_close(ahead.positions, waited.positions, rtol=0, atol=0, equal_nan=True)
    assert ahead.status.tolist() == waited.status.tolist()


class _Seen(Hook):
    """Records each call's step and the sum of the positions it sees."""

    def __init__(self, at: DynamicsStage, frequency: int = 1) -> None:
        super().__init__(frequency=frequency)
        self.stage = at
        self.calls: list[tuple[int, float]] = []

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        mask = dynamics.context.system_mask
        self.calls.append((dynamics.step_count, float(batch.positions.sum()),
                           None if mask is None else mask.tolist()))


@pytest.mark.parametrize("mode", MODES)
def test_hooks_after_the_step_see_what_they_see_in_the_run_that_waits(
        mode: tuple[bool, bool], monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``AFTER_STEP`` hook reads the positions and the stage's mask: the same in every mode."""
    hooks = {}

    def make(ahead: bool) -> Any:
        hooks[ahead] = _Seen(DynamicsStage.AFTER_STEP, frequency=3)
        return _fire(hooks=(hooks[ahead],))

    waited, _ = _run(lambda: make(False), False, monkeypatch)
    ahead, stage_a = _run(lambda: make(True), mode[0], monkeypatch, in_step=mode[1])
    assert (stage_a._engine.state.steps_run_ahead > 0) == mode[0]
    assert hooks[True].calls == hooks[False].calls and len(hooks[True].calls) > 5
    _same(ahead, waited)


def test_a_hook_before_the_next_step_keeps_that_step_from_running_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``BEFORE_STEP`` hook every 4 steps: the checks before those steps wait; the others run
    ahead; the hook sees what it sees without running ahead."""
    hooks = {}

    def make(ahead: bool) -> Any:
        hooks[ahead] = _Seen(DynamicsStage.BEFORE_STEP, frequency=4)
        return _fire(hooks=(hooks[ahead],))

    waited, _ = _run(lambda: make(False), False, monkeypatch)
    ahead, stage_a = _run(lambda: make(True), True, monkeypatch)
    steps = stage_a.step_count
    assert stage_a._engine.state.steps_run_ahead == steps - 1 - (steps - 1) // 4
    assert hooks[True].calls == hooks[False].calls
    _same(ahead, waited)


class _OnConverge(Hook):
    stage = DynamicsStage.ON_CONVERGE

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        pass


@pytest.mark.parametrize("case", ["on-converge hook", "fused stages", "checkpoints"])
def test_runs_whose_checks_may_change_the_next_step_do_not_run_ahead(
        case: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """A hook on convergence may read or change what the next step reads; a fused stage's next
    stage sets up the systems that enter it; a checkpoint holds the state after its step."""
    batch = _cells(3)
    if case == "on-converge hook":
        stage = _fire(hooks=(_OnConverge(),), tuning=_tuning(True))
        stage.run(batch)
    elif case == "fused stages":
        md = registry.build("integrator:velocity-verlet", model=_lj(), n_steps=5, dt=1.0)
        stage = FusedStage([(0, _fire()), (1, md)], tuning=_tuning(True))
        stage.run(batch)
    else:
        stage = _fire(tuning=_tuning(True))
        stage.run(batch, checkpoint=tmp_path / "run.ckpt", checkpoint_every=5)
    assert stage._engine.state.step_count > 5
    assert stage._engine.state.steps_run_ahead == 0


def test_steps_taken_one_at_a_time_do_not_run_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    stage, batch = _fire(tuning=_tuning(True)), _cells(2)
    for _ in range(6):
        stage.step(batch)
    assert stage._engine.state.step_count == 6 and stage._engine.state.steps_run_ahead == 0


def test_inflight_relaxations_through_a_sampler_rewrite_their_masks_in_the_step_to_the_same_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Refills change the set of systems (the masks' buffers are made anew on the host, as before);
    between them the steps rewrite the masks. Every structure comes out once, relaxed as in the
    run whose host rewrites them. (Runs with a sampler never run ahead.)"""
    from alchemi_core.data import AtomicData
    from alchemi_core.data.datapipes import ListDataset
    from alchemi_core.dynamics import HostMemory, SizeAwareSampler

    cells = rattled_argon(14, 0.03, 0.01, repeats=((1, 2, 2), (2, 2, 2)))
    structures = [AtomicData.from_atoms(atoms, dtype=torch.float64) for atoms in cells]

    def run(in_step: bool) -> tuple[Batch, int]:
        writes = _count_writes(monkeypatch)
        sampler = SizeAwareSampler(ListDataset(structures), max_atoms=130, max_batch_size=6, bin_width=32)
        sink = HostMemory(capacity=None)
        fire = registry.build("integrator:fire", model=_lj(), n_steps=300, dt=5.0, dt_max=50.0, sampler=sampler,
                              sinks=[sink], convergence_hook=ConvergenceHook.from_fmax(1e-3, frequency=1),
                              tuning=_tuning(True, in_step))
        fire.run()
        assert fire._engine.state.steps_run_ahead == 0
        return sink.read(), len(writes)

    host, none = run(False)
    in_step, writes = run(True)
    assert none == 0 and writes > 0
    assert sorted(in_step.system_id.tolist()) == list(range(14))
    assert in_step.system_id.tolist() == host.system_id.tolist()
    assert set(in_step.status.tolist()) == {1}
    _same(in_step, host)


def test_a_fused_relaxation_whose_systems_enter_a_second_fire_stage_rewrites_its_masks_in_the_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """FIRE to a loose threshold, then FIRE 2.0 to a tight one: systems enter the second stage at
    checks (set up from the host, ``init_state``), and the step's own mask rewrite moves them into
    its mask; every field ends as in the run whose host rewrites the masks. (Nothing runs ahead:
    systems enter a stage.)"""
    def make() -> Any:
        loose = registry.build("integrator:fire", model=_lj(), n_steps=300, dt=5.0, dt_max=50.0,
                               convergence_hook=ConvergenceHook.from_fmax(0.05, frequency=1))
        tight = registry.build("integrator:fire2", model=_lj(), n_steps=300, dt=5.0, dt_max=50.0,
                               convergence_hook=ConvergenceHook.from_fmax(1e-3, frequency=1))
        return FusedStage([(0, loose), (1, tight)])

    host, _ = _run(make, True, monkeypatch)
    in_step, stage = _run(make, True, monkeypatch, in_step=True)
    assert stage._engine.state.steps_run_ahead == 0
    assert in_step.status.tolist() == [2] * 6
    _same(in_step, host)
