"""On a GPU: a compiled run's checks replay their captured device work (``check_capture``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from ase.build import bulk

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.dynamics import ConvergenceHook

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = torch.device("cuda")


def _fire_relaxation(compiled: bool) -> tuple[Batch, Any]:
    """Six rattled argon cells relaxed by FIRE to 0.01 eV/Å, checked every step (as W2)."""
    cells = []
    for seed in range(6):
        atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(2)
        atoms.rattle(0.1, seed=seed)
        cells.append(atoms)
    batch = Batch.from_atoms(cells, dtype=torch.float64).to(CUDA)
    model = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5, shift_energy=True)
    stage = registry.build("integrator:fire", model=model, n_steps=300,
                           convergence_hook=ConvergenceHook.from_fmax(0.01, frequency=1))
    return batch, stage.compile() if compiled else stage


def test_compiled_checks_replay_their_captured_measurement_and_end_as_eager_ones() -> None:
    """Under compile() a check's device work (quarantine, fmax, convergence, the read-back's
    flags) is captured once the key repeats and replayed after: the systems converge at the same
    steps as eagerly (their step counts say so) and end at the same positions."""
    ends = {}
    for compiled in (False, True):
        batch, stage = _fire_relaxation(compiled)
        stage.run(batch)
        ends[compiled] = (batch, stage._engine)
    (eager, eager_engine), (graphed, engine) = ends[False], ends[True]
    assert eager.status.tolist() == graphed.status.tolist() == [1] * 6
    assert eager_engine.state.step_count == engine.state.step_count
    assert eager_engine.state.check_capture.captures == 0  # eager runs never capture
    # Systems converge at different steps: the key stays (same systems, same fields), so one
    # capture serves every check after the second.
    assert engine.state.check_capture.captures == 1
    assert engine.state.check_capture.enabled
    torch.testing.assert_close(graphed.positions, eager.positions, rtol=0, atol=1e-10)
    torch.testing.assert_close(graphed.fmax, eager.fmax, rtol=0, atol=1e-12)


def test_a_replayed_check_synchronises_once() -> None:
    from alchemi_core.testing.gpu import check_syncs

    batch, stage = _fire_relaxation(True)
    engine = stage._make_engine()
    engine.prepare(batch)
    for _ in range(3):  # checks measured eagerly, captured, then replayed
        engine.step()
    assert engine.state.check_capture.captures == 1
    syncs = check_syncs(engine, engine.state.step_count)
    assert len(syncs) == 1, syncs
    assert engine.state.check_capture.captures == 1


def test_a_measurement_that_reads_back_is_measured_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check whose device work synchronises after all (here: a patched mask that reads back)
    cannot be captured: capture turns itself off and the run ends as an eager one."""
    eager_batch, eager_stage = _fire_relaxation(False)
    eager_stage.run(eager_batch)
    batch, stage = _fire_relaxation(True)
    engine = stage._make_engine()
    plain = type(engine.state).active_mask

    def reading_back(self: Any) -> torch.Tensor:
        mask = plain(self)
        bool(mask.any())  # a host synchronisation: not allowed while a stream captures
        return mask

    monkeypatch.setattr(type(engine.state), "active_mask", reading_back)
    ran = engine.prepare(batch)
    with pytest.warns(RuntimeWarning, match="measured eagerly"):
        engine.run(300)
    assert not engine.state.check_capture.enabled and engine.state.check_capture.captures == 0
    assert ran.status.tolist() == eager_batch.status.tolist() == [1] * 6
    torch.testing.assert_close(ran.positions, eager_batch.positions, rtol=0, atol=1e-10)


def test_a_finished_run_holds_no_graph_memory() -> None:
    """A compiled run's captured step and checks are dropped when it ends, while the stage (and
    its engine, with which it forms a cycle) is still alive: a loop of runs, or a larger batch
    next, must not hold every earlier run's graph memory until the garbage collector runs."""
    batch, stage = _fire_relaxation(compiled=True)
    stage.run(batch, n_steps=3)  # warm: buffers and the model's lists exist
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    stage.run(batch, n_steps=40)
    torch.cuda.synchronize()
    engine = stage._engine
    assert engine.state.graph_captures >= 1 and engine.state.check_capture.captures >= 1  # it did capture
    assert engine.state.graph is None and engine.state.check_capture._graph is None
    # What the graphs' pools held during the run is back: allocated memory is where it was.
    assert torch.cuda.max_memory_allocated() > held
    assert torch.cuda.memory_allocated() <= held + 64 * 1024, (torch.cuda.memory_allocated(), held)


def test_checks_with_on_converge_hooks_are_captured_and_the_hooks_see_what_eager_ones_see() -> None:
    """``ON_CONVERGE`` hooks run after the check's read-back, outside its device work, so that
    work is captured with them too; they fire at the same steps with the same systems."""
    from alchemi_core.dynamics import DynamicsStage, Hook

    class ConvergedAt(Hook):
        stage = DynamicsStage.ON_CONVERGE

        def __init__(self) -> None:
            super().__init__(frequency=1)
            self.seen: list[tuple[int, list[int]]] = []

        def __call__(self, batch: Batch, dynamics: Any) -> None:
            self.seen.append((dynamics.step_count, torch.nonzero(dynamics.converged_mask).flatten().tolist()))

    seen = {}
    for compiled in (False, True):
        batch, stage = _fire_relaxation(compiled)
        hook = ConvergedAt()
        stage.hooks.append(hook)
        stage.run(batch)
        seen[compiled] = (hook.seen, stage._engine.state.check_capture.captures, batch.status.tolist())
    (eager, eager_captures, eager_status), (graphed, captures, status) = seen[False], seen[True]
    assert eager_status == status == [1] * 6
    assert eager == graphed and sum(len(ids) for _, ids in graphed) == 6
    assert eager_captures == 0 and captures == 1
