"""The dynamics engine: physics of the reference integrator, budgets, convergence, hooks,
inflight refill accounting, sinks and the no-host-sync rule."""

from __future__ import annotations

import contextlib
import re
from collections import Counter

import pytest
import torch

from alchemi_core.data import AtomicData, Batch
from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import (
    ConvergenceHook,
    DemoDynamics,
    DynamicsStage,
    FusedStage,
    Hook,
    HostMemory,
    SizeAwareSampler,
)
from alchemi_core.dynamics.forward import forward
from alchemi_core.errors import CapacityError, ConfigurationError, InvalidDataError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import make_batch, never_converging, random_structures
from alchemi_core.units import ACCELERATION


def total_energy(batch: Batch) -> torch.Tensor:
    ke = 0.5 * batch.atomic_masses * (batch.velocities**2).sum(-1) / ACCELERATION
    per_sys = torch.zeros(batch.num_graphs, dtype=ke.dtype).index_add_(0, batch.batch_idx, ke)
    return batch.energy.view(-1) + per_sys


class StepCounter(Hook):
    """Counts, per system_id, the steps in which its stage integrated it."""

    stage = DynamicsStage.AFTER_STEP

    def __init__(self):
        super().__init__(frequency=1)
        self.counts: Counter[int] = Counter()

    def __call__(self, batch, dynamics):
        mask = dynamics.context.system_mask
        ids = batch.system_id if mask is None else batch.system_id[mask]
        self.counts.update(ids.tolist())


def test_velocity_verlet_conserves_energy():
    torch.manual_seed(0)
    batch = make_batch([4, 6], dtype=torch.float64)
    batch.set_field("velocities", torch.randn(10, 3, dtype=torch.float64) * 0.005, "node")
    dyn = DemoDynamics(model=DemoModelWrapper(), n_steps=1, dt=0.2)
    dyn.run(batch)
    e0 = total_energy(batch)
    dyn.run(batch, n_steps=2000)
    drift = (total_energy(batch) - e0).abs()
    # Velocity Verlet: bounded O(dt^2) energy error, no secular drift.
    assert float(drift.max()) < 1e-4, drift


def test_single_stage_runs_n_steps_and_keeps_status():
    counter = StepCounter()
    batch = make_batch([3, 2])
    out = DemoDynamics(model=DemoModelWrapper(), n_steps=37, dt=0.5, hooks=[counter]).run(batch)
    assert out is batch and batch.status.tolist() == [0, 0]
    assert counter.counts == {0: 37, 1: 37}


def test_fused_budgets_give_each_system_its_steps_in_each_stage():
    a, b = StepCounter(), StepCounter()
    model = DemoModelWrapper()
    never = never_converging()
    fused = DemoDynamics(model=model, n_steps=13, dt=0.5, hooks=[a], convergence_hook=never) + DemoDynamics(
        model=model, n_steps=7, dt=0.5, hooks=[b]
    )
    out = fused.run(make_batch([3, 4, 2]))
    assert out.status.tolist() == [2, 2, 2]
    assert a.counts == {0: 13, 1: 13, 2: 13} and b.counts == {0: 7, 1: 7, 2: 7}


def test_convergence_moves_systems_on_at_the_check():
    a, b = StepCounter(), StepCounter()
    model = DemoModelWrapper()
    always = ConvergenceHook(criteria=[{"key": "fmax", "threshold": 1e9}], frequency=1)
    fused = DemoDynamics(model=model, n_steps=50, dt=0.5, hooks=[a], convergence_hook=always) + DemoDynamics(
        model=model, n_steps=5, dt=0.5, hooks=[b]
    )
    fused.run(make_batch([3, 4]))
    assert a.counts == {0: 1, 1: 1} and b.counts == {0: 5, 1: 5}


class MaskVersions(Hook):
    """Records the stage context's version after every step."""

    stage = DynamicsStage.AFTER_STEP

    def __init__(self):
        super().__init__(frequency=1)
        self.versions: list[int] = []

    def __call__(self, batch, dynamics):
        self.versions.append(dynamics.context.version)


class MoveSystemAt(Hook):
    """Between checks, moves system ``row`` to status ``to`` at step ``at`` (as a hook may)."""

    stage = DynamicsStage.AFTER_STEP

    def __init__(self, at: int, row: int, to: int):
        super().__init__(frequency=1)
        self.at, self.row, self.to = at, row, to

    def __call__(self, batch, dynamics):
        if dynamics.step_count == self.at:
            batch.status[self.row] = self.to


def test_a_check_that_changes_nothing_keeps_the_masks_and_one_that_does_rewrites_them():
    """Checks every step with nothing converging leave the stage's masks (and the values derived
    from them) alone; a system moved by the check, or by a hook between two
    checks, is taken out of its stage at the next check."""
    model = DemoModelWrapper()
    quiet = MaskVersions()
    DemoDynamics(model=model, n_steps=12, dt=0.5, hooks=[quiet],
                 convergence_hook=never_converging(frequency=1)).run(make_batch([3, 4]))
    assert len(set(quiet.versions)) == 1, quiet.versions
    counter, versions = StepCounter(), MaskVersions()
    stage = DemoDynamics(model=model, n_steps=12, dt=0.5, hooks=[MoveSystemAt(4, row=1, to=7), counter, versions],
                         convergence_hook=ConvergenceHook(criteria=[{"key": "fmax", "threshold": 1e-9}],
                                                          frequency=3))
    out = stage.run(make_batch([3, 4]))
    assert out.status.tolist() == [0, 7]
    assert counter.counts == {0: 12, 1: 7}  # steps 0-6: the check after step 6 saw the hook's move
    assert len(set(versions.versions)) == 2


class DerivesActive(DemoDynamics):
    """Registers a ``[B]`` float copy of its system mask through its context, as integrators do."""

    def pre_update(self, batch):
        ctx = self.context
        if ctx.system_mask is not None:
            self.active = ctx.derived("active", lambda: ctx.system_mask.to(batch.positions.dtype))
        super().pre_update(batch)


@pytest.mark.parametrize("compiled", [True, False])
def test_the_engine_rebuilds_what_a_stage_derived_from_its_masks_in_place(compiled):
    """A captured step (the graph of ``compile()`` on a GPU) reads the derived values it was
    captured with: when a check moves a system out of a stage, the engine rewrites them in place
    (and keeps the step). Where no step is captured it keeps no build (a build refers to the stage):
    the value is dropped and the stage's next call builds it anew. A change of systems and the run's
    end drop every value. The GPU tests replay such runs against eager ones
    (tests/integration/test_graph_across_checks_gpu.py)."""
    model = DemoModelWrapper()
    first = DerivesActive(model=model, n_steps=20, dt=0.5)
    fused = first + DemoDynamics(model=model, n_steps=20, dt=0.5)
    if compiled:
        fused = fused.compile()
    batch = make_batch([3, 4, 2])
    fused.step(batch)
    engine, held = fused._engine, first.active
    assert held.tolist() == [1.0, 1.0, 1.0]
    batch.status[0] = 1  # system 0 leaves the first stage, as a check moves it
    engine.masks.update(engine.state.batch)
    fused.step(batch)
    assert first.active.tolist() == [0.0, 1.0, 1.0]
    assert (first.active is held) is compiled
    assert (first.context.derived("active", lambda: None) is first.active)
    batch.defrag(torch.tensor([False, False, True]))  # a system left: the values are dropped
    engine.masks.update(batch)
    fused.step(batch)
    assert first.active.tolist() == [0.0, 1.0] and first.active is not held
    engine.release_run()
    assert first.context.derived("gone", lambda: 7) == 7 and first.context.derived("active", lambda: 8) == 8


def test_criteria_must_all_pass():
    model = DemoModelWrapper()
    hook = ConvergenceHook(criteria=[{"key": "fmax", "threshold": 1e9}, {"key": "energy_change", "threshold": 0.0}])
    counter = StepCounter()
    out = DemoDynamics(model=model, n_steps=20, dt=0.5, convergence_hook=hook, hooks=[counter]).run(make_batch([3]))
    assert out.status.tolist() == [0] and counter.counts == {0: 20}
    assert "energy_change" in out and "fmax" in out


def test_convergence_reductions_match_manual_values():
    batch = make_batch([2, 3], dtype=torch.float64)
    batch.set_field("forces", torch.tensor([[3.0, 4, 0], [0, 0, 1], [0, 0, 0.5], [1, 0, 0], [0, 2, 0]], dtype=torch.float64), "node")
    norms = torch.tensor([5.0, 1.0, 0.5, 1.0, 2.0], dtype=torch.float64)
    per_sys_max = torch.tensor([5.0, 2.0], dtype=torch.float64)

    def verdict(**crit):
        return ConvergenceHook(criteria=[crit]).evaluate(batch).tolist()

    assert verdict(key="forces", threshold=2.0) == (per_sys_max <= 2.0).tolist()
    assert verdict(key="forces", threshold=2.0, reduce_op="norm") == [False, True]
    assert verdict(key="forces", threshold=1.0, reduce_op="max") == [False, False]
    # "sum" and "mean" reduce the components of each atom, then the atoms of each system:
    # sums per system are 8 and 3.5; means are 4/3 and 7/18.
    assert verdict(key="forces", threshold=5.5, reduce_op="sum", reduce_dims=-1) == [False, True]
    assert verdict(key="forces", threshold=1.0, reduce_op="mean", reduce_dims=-1) == [False, True]
    assert verdict(key="forces", threshold=1.4, reduce_op="mean", reduce_dims=-1) == [True, True]
    assert norms.max() == per_sys_max[0]
    assert verdict(key="forces", threshold=0.0, custom_op=lambda f: f[:, 0] > -1) == [True, True]
    assert verdict(key="forces", threshold=0.0, custom_op=lambda f: f[:, 0] < 2) == [False, True]
    assert verdict(key="forces", threshold=3.5, custom_op=lambda f: f.abs().sum(-1)) == [False, True]
    with pytest.raises(InvalidDataError, match="no such field"):
        verdict(key="does_not_exist", threshold=1.0)


@pytest.mark.parametrize("dims", [2, -2, 0, (1, 5)])
def test_reduce_dims_out_of_range_is_a_clear_error_naming_the_criterion_and_the_range(dims):
    batch = make_batch([2, 3], dtype=torch.float64)
    batch.set_field("forces", torch.ones(5, 3, dtype=torch.float64), "node")
    hook = ConvergenceHook(criteria=[{"key": "forces", "threshold": 1.0, "reduce_op": "norm", "reduce_dims": dims}])
    with pytest.raises(ConfigurationError, match=rf"criterion 'forces': reduce_dims {re.escape(repr(dims))} is out "
                                                 r"of range for forces of shape \[5, 3\]; name dimensions 1 to 1"):
        hook.evaluate(batch)
    with pytest.raises(ConfigurationError, match="reduce_dims must be an int, a list of ints or None, got 'x'"):
        ConvergenceHook(criteria=[{"key": "forces", "threshold": 1.0, "reduce_dims": "x"}])
    with pytest.raises(ConfigurationError, match="reduce_op"):
        ConvergenceHook(criteria=[{"key": "fmax", "threshold": 1, "reduce_op": "median"}])


def test_hook_points_run_in_order_at_their_frequency():
    seen: list[tuple[int, str]] = []

    class Record(Hook):
        def __init__(self, stage, frequency=1):
            super().__init__(frequency=frequency, stage=stage)

        def __call__(self, batch, dynamics):
            seen.append((dynamics.step_count, self.stage.name))

    hooks = [Record(s) for s in DynamicsStage if s is not DynamicsStage.ON_CONVERGE]
    hooks.append(Record(DynamicsStage.ON_CONVERGE))
    hooks.append(Record(DynamicsStage.AFTER_STEP, frequency=2))
    never = never_converging(frequency=1)
    DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5, hooks=hooks, convergence_hook=never).run(make_batch([2]))
    step0 = [name for step, name in seen if step == 0]
    inner = [s.name for s in DynamicsStage if s is not DynamicsStage.AFTER_STEP][:7]
    assert step0 == [*inner, "AFTER_STEP", "AFTER_STEP"]
    assert "ON_CONVERGE" not in {name for _, name in seen}  # nothing converged
    assert [name for step, name in seen if step == 1].count("AFTER_STEP") == 1
    assert len([1 for _, name in seen if name == "BEFORE_STEP"]) == 3


class _SyncForbidden(RuntimeError):
    pass


@contextlib.contextmanager
def forbid_host_reads():
    """Make every way of reading a tensor back to the host raise."""
    names = ["item", "tolist", "__bool__", "numpy", "cpu", "__int__", "__float__"]
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def bomb(*_a, **_k):
        raise _SyncForbidden("host read inside a step")

    try:
        for n in names:
            setattr(torch.Tensor, n, bomb)
        yield
    finally:
        for n, f in saved.items():
            setattr(torch.Tensor, n, f)


def test_steps_between_checks_never_read_back_from_the_device():
    model = DemoModelWrapper()
    batch = make_batch([3, 4, 5])
    opt = DemoDynamics(model=model, n_steps=40, dt=0.5,
                       convergence_hook=ConvergenceHook.from_fmax(0.01, frequency=10))
    md = DemoDynamics(model=model, n_steps=40, dt=0.5)
    fused = opt + md
    engine = fused.make_engine()
    engine.prepare(batch)
    fused._engine = engine
    assert engine.state.check_interval == 10
    for _ in range(25):
        k = engine.state.step_count
        if k % engine.state.check_interval == 0:
            engine.step()  # a check step may read back
        else:
            with forbid_host_reads():
                engine.step()


def _dataset(n: int, seed: int = 0) -> ListDataset:
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(2, 9, (n,), generator=g).tolist()
    return ListDataset(random_structures(sizes))


def test_inflight_fused_run_accounts_for_every_structure_exactly_once():
    n = 1000
    model = DemoModelWrapper()
    sampler = SizeAwareSampler(_dataset(n), max_atoms=300, max_batch_size=64, bin_width=2)
    sink = HostMemory(capacity=n)
    opt = DemoDynamics(model=model, n_steps=6, dt=0.5, sampler=sampler, refill_frequency=3,
                       convergence_hook=ConvergenceHook.from_fmax(0.05, frequency=3), sinks=[sink])
    md = DemoDynamics(model=model, n_steps=4, dt=0.5)
    fused = opt + md
    with fused:
        assert fused.run() is None
    out = sink.read()
    ids = out.system_id.tolist()
    assert len(ids) == n and sorted(ids) == list(range(n))
    assert set(out.status.tolist()) == {2}
    assert sampler.exhausted and fused.active_batch.num_graphs == 0


def test_inflight_without_sinks_returns_every_structure():
    sampler = SizeAwareSampler(_dataset(60, seed=3), max_atoms=80, max_batch_size=10, bin_width=2)
    out = DemoDynamics(model=DemoModelWrapper(), n_steps=5, dt=0.5, sampler=sampler).run()
    assert sorted(out.system_id.tolist()) == list(range(60))


def test_a_full_sink_raises_and_loses_nothing():
    n = 40
    sampler = SizeAwareSampler(_dataset(n, seed=1), max_atoms=60, max_batch_size=8, bin_width=2)
    first, second = HostMemory(capacity=10), HostMemory(capacity=15)
    stage = DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5, sampler=sampler, sinks=[first, second])
    with pytest.raises(CapacityError, match="every sink is full") as err:
        stage.run()
    assert isinstance(err.value, RuntimeError)
    written = first.read().system_id.tolist() + second.read().system_id.tolist()
    assert len(written) == 25 == len(set(written))
    still = stage.active_batch.system_id.tolist()
    assert not set(still) & set(written)
    assert len(set(still) | set(written)) == len(still) + len(written)


def test_nan_positions_are_rejected_with_the_system():
    batch = make_batch([2, 3])
    batch.positions[3, 1] = float("nan")
    with pytest.raises(InvalidDataError, match=r"system_id \[1\]"):
        DemoDynamics(model=DemoModelWrapper(), n_steps=2, dt=0.5).run(batch)


def test_sampler_rejects_a_structure_larger_than_max_atoms():
    ds = ListDataset(random_structures([3, 12, 4]))
    with pytest.raises(InvalidDataError, match="structure 1 has 12 atoms but max_atoms is 10"):
        SizeAwareSampler(ds, max_atoms=10)


def test_a_sampler_batches_stored_structures_instead_of_moving_each_one(monkeypatch):
    # A dataset that puts structures on a device hands them to the sampler where they are held;
    # the batch copies each field once (on a GPU: a handful of copies per refill, not one per
    # structure and field). Results are those of the structures moved one by one.
    structures = random_structures([3, 5, 4, 6, 2, 5, 4])
    expected = DemoDynamics(model=DemoModelWrapper(), n_steps=6, dt=0.5, sampler=SizeAwareSampler(
        ListDataset(structures), max_atoms=12, max_batch_size=3)).run()
    moved = []
    original = AtomicData.to

    def counting(self, device=None, dtype=None):
        if device is not None:  # a move (a shallow copy, .to(), is not one)
            moved.append(self)
        return original(self, device, dtype)

    monkeypatch.setattr(AtomicData, "to", counting)
    sampler = SizeAwareSampler(ListDataset(structures, device="cpu"), max_atoms=12, max_batch_size=3)
    assert sampler.build_initial_batch().device == torch.device("cpu")
    sampler = SizeAwareSampler(ListDataset(structures, device="cpu"), max_atoms=12, max_batch_size=3)
    got = DemoDynamics(model=DemoModelWrapper(), n_steps=6, dt=0.5, sampler=sampler).run()
    assert moved == []
    assert sampler.request_many(1, 12, None) == []  # exhausted; request_many still moves (public API)
    order, ref = got.system_id.argsort(), expected.system_id.argsort()
    assert got.system_id[order].tolist() == expected.system_id[ref].tolist() == list(range(7))
    torch.testing.assert_close(got.positions.view(-1, 3).sum(), expected.positions.view(-1, 3).sum())


class _FinishesAtItsOwnStep(ConvergenceHook):
    """Converged once a structure has taken ``steps_needed`` steps (a per-structure field)."""

    def evaluate(self, batch):
        return batch.stage_steps >= batch.steps_needed.reshape(-1)


def test_systems_enter_only_at_refill_steps_when_budgets_end_between_them(monkeypatch):
    # The first batch starts one step ahead of the refill cadence (every 5 steps), so its 8-step
    # budgets end between refill steps while other systems, converging at checks, keep the batch
    # busy. Those graduates wait, not stepping, for the next refill step; refilling at once would
    # admit systems out of step, whose budgets end between refill steps again: a chain of small
    # refills, each with a forward of the whole batch.
    from alchemi_core.dynamics import admission

    admitted_at = []
    original = admission.Admission.admit

    def recording(self, batch, incoming, partial=False):
        admitted_at.append(self.state.step_count)
        return original(self, batch, incoming, partial)

    monkeypatch.setattr(admission.Admission, "admit", recording)
    structures = random_structures([3, 4] * 8)
    for i, s in enumerate(structures):
        s.steps_needed = torch.tensor([4 if i % 2 == 0 else 100])  # odd ones run to their budget
    sampler = SizeAwareSampler(ListDataset(structures), max_atoms=8, max_batch_size=2)
    sink = HostMemory(capacity=None)
    converge = _FinishesAtItsOwnStep(criteria=[{"key": "steps_needed", "threshold": 0.0}], frequency=5)
    stage = DemoDynamics(model=DemoModelWrapper(), n_steps=8, dt=0.5, sampler=sampler, sinks=[sink],
                         refill_frequency=5, convergence_hook=converge)
    stage.run()
    assert sorted(sink.read().system_id.tolist()) == list(range(16))
    assert admitted_at and all((k - 1) % 5 == 0 for k in admitted_at), admitted_at


def test_bad_configuration_is_rejected():
    model = DemoModelWrapper()
    with pytest.raises(ConfigurationError, match="comm_mode"):
        DemoDynamics(model=model, comm_mode="later")
    with pytest.raises(ConfigurationError, match="dt"):
        DemoDynamics(model=model, dt=0.0)
    with pytest.raises(ConfigurationError, match="not a hook"):
        DemoDynamics(model=model, hooks=[object()])
    with pytest.raises(ConfigurationError, match="sampler"):
        DemoDynamics(model=model).run()
    with pytest.raises(ConfigurationError, match="distinct"):
        FusedStage([(0, DemoDynamics(model=model)), (0, DemoDynamics(model=model))])


def test_step_by_step_matches_run():
    model = DemoModelWrapper()
    a, b = make_batch([3, 2], dtype=torch.float64), make_batch([3, 2], dtype=torch.float64)
    DemoDynamics(model=model, n_steps=12, dt=0.5).run(a)
    stepper = DemoDynamics(model=model, n_steps=12, dt=0.5)
    for _ in range(12):
        stepper.step(b)
    torch.testing.assert_close(a.positions, b.positions)


def test_different_models_per_stage_each_give_their_stage_forces():
    soft, stiff = DemoModelWrapper(depth=0.05), DemoModelWrapper(depth=0.5)
    batch = make_batch([3, 3], dtype=torch.float64)
    fused = FusedStage([(0, DemoDynamics(model=soft, n_steps=1, dt=0.1)), (1, DemoDynamics(model=stiff, n_steps=1000, dt=0.1))])
    engine = fused.make_engine()
    engine.prepare(batch)
    batch.status.copy_(torch.tensor([0, 1]))
    engine.masks.update(engine.state.batch)
    forward(engine.state, batch)
    ref_soft = soft(batch)["forces"][:3]
    ref_stiff = stiff(batch)["forces"][3:]
    torch.testing.assert_close(batch.forces[:3], ref_soft)
    torch.testing.assert_close(batch.forces[3:], ref_stiff)


def test_structures_keep_their_own_fields_through_refill():
    structures = random_structures([3, 4, 5, 2], extras=True)
    sampler = SizeAwareSampler(ListDataset(structures), max_atoms=8, max_batch_size=2, bin_width=1)
    out = DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5, sampler=sampler).run()
    for row, sid in enumerate(out.system_id.tolist()):
        assert out.index_select([row]).tag.tolist() == structures[sid].tag.tolist()
        assert torch.equal(out.index_select([row]).frozen, structures[sid].frozen)


def test_atomic_data_without_masses_gets_standard_ones():
    batch = Batch.from_data_list([AtomicData(atomic_numbers=[18, 1], positions=torch.tensor([[0.0, 0, 0], [1.5, 0, 0]]))])
    DemoDynamics(model=DemoModelWrapper(), n_steps=1, dt=0.5).run(batch)
    assert batch.atomic_masses.tolist() == pytest.approx([39.948, 1.008])


def test_inner_hooks_run_once_per_step_for_their_own_stage():
    calls: list[tuple[str, int]] = []

    class Tag(Hook):
        def __init__(self, name, stage):
            super().__init__(frequency=1, stage=stage)
            self.name = name

        def __call__(self, batch, dynamics):
            calls.append((self.name, int(dynamics.context.system_mask.sum())))

    model = DemoModelWrapper()
    a = DemoDynamics(model=model, n_steps=3, dt=0.5, hooks=[Tag("a", DynamicsStage.BEFORE_PRE_UPDATE)])
    b = DemoDynamics(model=model, n_steps=2, dt=0.5, hooks=[Tag("b", DynamicsStage.AFTER_POST_UPDATE)])
    (a + b).run(make_batch([2, 3]))
    assert [c for c in calls if c[0] == "a"] == [("a", 2)] * 3 + [("a", 0)] * 2
    assert [c for c in calls if c[0] == "b"] == [("b", 0)] * 3 + [("b", 2)] * 2


def test_init_state_sees_only_systems_that_enter():
    entered: list[list[bool]] = []

    class Recording(DemoDynamics):
        def init_state(self, batch, entering):
            entered.append(entering.tolist())

    model = DemoModelWrapper()
    batch = make_batch([3, 2])
    stage = Recording(model=model, n_steps=4, dt=0.5)
    stage.run(batch)
    stage.run(batch)  # continuing: nothing enters again
    assert entered == [[True, True]]
    entered.clear()
    always = ConvergenceHook(criteria=[{"key": "fmax", "threshold": 1e9}], frequency=1)
    never = never_converging(frequency=1)
    first = Recording(model=model, n_steps=5, dt=0.5, convergence_hook=never)
    second = Recording(model=model, n_steps=3, dt=0.5, convergence_hook=always)
    (first + second).run(make_batch([3, 2]))
    # Every stage is told (its own share) at run start and at the two checks where systems
    # moved: to stage 1 after 5 steps, to the exit one step later; never at other checks.
    assert entered == [[True, True], [False, False]] * 1 + [[False, False], [True, True]] + [[False, False]] * 2


def test_graduates_are_written_when_the_run_ends_between_refill_checks():
    n = 30
    sampler = SizeAwareSampler(_dataset(n, seed=5), max_atoms=400, max_batch_size=64, bin_width=2)
    sink = HostMemory(capacity=n)
    # Converged after the second step (step index 1), which is not a refill check (every 7).
    second = ConvergenceHook(criteria=[{"key": "stage_steps", "threshold": 0, "custom_op": lambda s: s >= 2}])
    stage = DemoDynamics(model=DemoModelWrapper(), n_steps=50, dt=0.5, sampler=sampler, sinks=[sink],
                         refill_frequency=7, convergence_hook=second)
    stage.run()
    assert sorted(sink.read().system_id.tolist()) == list(range(n))


def test_a_model_that_cannot_be_captured_keeps_a_compiled_stage_eager():
    class Eager(DemoModelWrapper):
        cuda_graphs = False

    assert DemoDynamics(model=DemoModelWrapper(), n_steps=1, dt=0.5).compile()._make_engine().state.graph_requested
    assert not DemoDynamics(model=Eager(), n_steps=1, dt=0.5).compile()._make_engine().state.graph_requested


def test_a_sampler_sized_from_memory_plans_with_the_models_bytes_per_atom(monkeypatch):
    free = 80 * 2**30
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (free, 2 * free))
    sampler = SizeAwareSampler(_dataset(20), max_atoms=None, bin_width=2)
    assert sampler.max_atoms == int(free * 0.8 / 8192)
    assert sampler.plan_memory(2e6) == int(free * 0.8 / 2e6)
    fixed = SizeAwareSampler(_dataset(20), max_atoms=50, bin_width=2)
    assert fixed.plan_memory(2e6) == 50  # a number the user gave is kept
    monkeypatch.undo()

    class Heavy(DemoModelWrapper):
        def bytes_per_atom(self):
            return 3e6

    sampler = SizeAwareSampler(_dataset(10), max_atoms=None, bin_width=2)
    DemoDynamics(model=Heavy(), n_steps=2, dt=0.5, sampler=sampler).run()
    assert sampler.bytes_per_atom == 3e6


class FlagsItsErrors(DemoModelWrapper):
    """A model that records an error on the device (``flag``) and raises it in ``verify``."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = torch.zeros((), dtype=torch.bool)
        self.verified = 0

    def error_flag(self, batch: Batch) -> torch.Tensor:
        return self.flag

    def verify(self, batch: Batch) -> None:
        self.verified += 1
        if bool(self.flag):
            raise CapacityError("recorded on the device")


def test_a_check_verifies_a_model_only_when_its_error_flag_is_set_and_then_takes_no_effect():
    model = FlagsItsErrors()
    stage = DemoDynamics(model=model, n_steps=50, dt=0.5,
                         convergence_hook=ConvergenceHook.from_fmax(1e9, frequency=1))  # all converge
    engine = stage._make_engine()
    engine.prepare(make_batch([3, 4, 5]))
    at_start = model.verified  # the run's start verifies directly
    engine.check(1)
    assert model.verified == at_start  # its flag rode on the check's read-back: clear, no verify
    assert engine.state.batch.status.tolist() == [1, 1, 1]  # and the check took effect
    model.flag.fill_(True)
    engine.state.batch.status.fill_(0)
    with pytest.raises(CapacityError, match="recorded on the device"):
        engine.check(2)
    assert model.verified == at_start + 1
    assert engine.state.batch.status.tolist() == [0, 0, 0]  # a check that raises converges nothing


def test_a_model_without_an_error_flag_is_verified_at_every_check():
    model = DemoModelWrapper()
    calls = Counter()
    model.verify = lambda batch: calls.update(["verify"])  # type: ignore[method-assign]
    stage = DemoDynamics(model=model, n_steps=50, dt=0.5, convergence_hook=never_converging(1))
    engine = stage._make_engine()  # runs while its stage is alive (it holds the stage weakly)
    engine.prepare(make_batch([3, 4]))
    calls.clear()
    for k in (1, 2, 3):
        engine.check(k)
    assert calls["verify"] == 3
