"""Structures that go bad are quarantined at the next check, with a failure status and a reason;
the run goes on (finding 4 of issue 13: a model returning NaN forces ran to the end with NaN
positions and no error)."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import ConvergenceHook, DemoDynamics, HostMemory, SizeAwareSampler
from alchemi_core.dynamics.quarantine import FAILED_EXTENT, FAILED_FORCES, FAILED_POSITIONS
from alchemi_core.errors import InvalidDataError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import make_batch, random_structures
from alchemi_core.testing.exploding import ExplodingModel


def test_a_plain_run_quarantines_the_system_whose_forces_are_nan():
    model = ExplodingModel(DemoModelWrapper(), explode=[1], after=3)
    batch = make_batch([3, 4, 2], dtype=torch.float64)
    stage = DemoDynamics(model=model, n_steps=30, dt=0.5)
    out = stage.run(batch)
    assert stage.step_count == 30
    assert out.status.tolist()[0] == 0 and out.status.tolist()[2] == 0
    bad = -out.status[1].item()
    assert bad & FAILED_FORCES and bad & FAILED_POSITIONS
    assert [q.system_id for q in stage.quarantined] == [1]
    assert "forces are not finite" in stage.quarantined[0].reason
    # The others are untouched by their neighbour's NaN: the same as a run without it.
    clean = DemoDynamics(model=DemoModelWrapper(), n_steps=30, dt=0.5).run(make_batch([3, 4, 2], dtype=torch.float64))
    for s in (0, 2):
        rows = out.batch_idx == s
        torch.testing.assert_close(out.positions[rows], clean.positions[rows], rtol=0, atol=0)


def test_a_run_without_checks_acts_on_its_health_check_when_the_codes_are_read():
    """A run without checks looks every 100 steps; its codes are read at the next look, at the
    run's end, or when ``quarantined`` is asked for (the GPU's queue does not drain for them),
    and the record names the step that was looked at."""
    model = ExplodingModel(DemoModelWrapper(), explode=[1], after=3)
    batch = make_batch([3, 4, 2], dtype=torch.float64)
    stage = DemoDynamics(model=model, n_steps=1000, dt=0.5)
    for _ in range(100):
        stage.step(batch)
    assert batch.status.tolist() == [0, 0, 0]  # the look at step 99 is on its way
    assert [(q.system_id, q.step) for q in stage.quarantined] == [(1, 99)]
    assert batch.status[1].item() < 0 and batch.status[[0, 2]].tolist() == [0, 0]
    for _ in range(150):  # two more looks: the quarantined system is not recorded again
        stage.step(batch)
    assert [(q.system_id, q.step) for q in stage.quarantined] == [(1, 99)]
    # A run reads its last look before it returns.
    run = DemoDynamics(model=ExplodingModel(DemoModelWrapper(), explode=[2], after=3), n_steps=200, dt=0.5)
    out = run.run(make_batch([3, 4, 2], dtype=torch.float64))
    assert [(q.system_id, q.step) for q in run._engine.state.quarantined] == [(2, 99)]
    assert out.status[2].item() < 0


def test_strict_raises_naming_the_system():
    model = ExplodingModel(DemoModelWrapper(), explode=[2])
    stage = DemoDynamics(model=model, n_steps=300, dt=0.5, strict=True)
    with pytest.raises(InvalidDataError, match=r"system_id 2 at step \d+: .*forces are not finite.*strict=True"):
        stage.run(make_batch([3, 4, 2]))


def test_quarantined_structures_go_to_the_sinks_once_and_the_run_goes_on():
    data = ListDataset(random_structures([3, 4, 5, 3, 4, 5, 3, 4, 5, 3, 4, 5], dtype=torch.float64))
    sampler = SizeAwareSampler(data, max_atoms=14, max_batch_size=3, bin_width=1)
    sink = HostMemory(capacity=None)
    model = ExplodingModel(DemoModelWrapper(), explode=[4, 9])
    stage = DemoDynamics(model=model, n_steps=12, dt=0.5, sampler=sampler, sinks=[sink], refill_frequency=2,
                         convergence_hook=ConvergenceHook.from_fmax(1e-9, frequency=2))
    stage.run()
    out = sink.read()
    assert sorted(out.system_id.tolist()) == list(range(12))
    status = dict(zip(out.system_id.tolist(), out.status.tolist(), strict=False))
    assert {i for i, s in status.items() if s < 0} == {4, 9}
    assert all(s == 1 for i, s in status.items() if i not in (4, 9))
    assert sorted(q.system_id for q in stage.quarantined) == [4, 9]
    assert all("forces are not finite" in q.reason for q in stage.quarantined)


def test_atoms_flying_apart_are_quarantined():
    batch = make_batch([2, 2], dtype=torch.float64)
    v = torch.zeros_like(batch.positions)
    v[2:] = torch.tensor([[-50.0, 0, 0], [50.0, 0, 0]], dtype=torch.float64)  # system 1 flies apart
    batch.set_field("velocities", v, "node")
    stage = DemoDynamics(model=DemoModelWrapper(), n_steps=200, dt=1.0, max_extent=500.0)
    out = stage.run(batch)
    assert out.status[0].item() == 0 and -out.status[1].item() == FAILED_EXTENT
    assert stage.quarantined[0].reason == "atoms flew apart"


@pytest.mark.parametrize("largest", [6, 70])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", ["torch", "warp"])
def test_failure_codes_are_each_systems_own_bits(backend, dtype, largest):
    """The codes of a whole batch, computed at once (in torch or in Warp kernels), against each
    system judged alone: systems smaller than a Warp thread's run of atoms (several per thread)
    and larger (several threads per system)."""
    from alchemi_core.dynamics.quarantine import FAILED_ENERGY, FAILED_VELOCITIES, HealthCheck, warp_codes

    if backend == "warp":
        pytest.importorskip("warp")
    g = torch.Generator().manual_seed(3)
    sizes = [int(x) for x in torch.randint(1, largest + 1, (60,), generator=g)]
    batch = make_batch(sizes, dtype=dtype)
    n = batch.num_nodes
    batch.set_field("velocities", torch.randn(n, 3, generator=g).to(dtype), "node")
    batch.set_field("forces", torch.randn(n, 3, generator=g).to(dtype), "node")
    batch.set_field("energy", torch.randn(len(sizes), 1, generator=g).to(dtype), "system")
    poison = (float("nan"), float("inf"), -float("inf"))
    for i, name in enumerate(("positions", "velocities", "forces")):
        rows = torch.randint(0, n, (6,), generator=g)
        getattr(batch, name)[rows, i] = poison[i]
    batch.positions[torch.randint(0, n, (6,), generator=g)] += 5.0e4
    batch.energy[torch.randint(0, len(sizes), (4,), generator=g)] = float("nan")
    if backend == "warp":
        assert warp_codes(batch, 1.0e4) is not None  # the Warp path ran, not the fallback
    codes = HealthCheck(max_extent=1.0e4).codes(batch, backend=backend).tolist()
    expected = []
    for s in range(len(sizes)):
        rows = batch.batch_idx == s
        code = 0
        for bit, name in ((FAILED_POSITIONS, "positions"), (FAILED_VELOCITIES, "velocities"), (FAILED_FORCES, "forces")):
            if not torch.isfinite(getattr(batch, name)[rows]).all():
                code |= bit
        if not torch.isfinite(batch.energy[s]).all():
            code |= FAILED_ENERGY
        pos = batch.positions[rows].double()
        if not code & FAILED_POSITIONS and float((pos.max(0).values - pos.min(0).values).max()) > 1.0e4:
            code |= FAILED_EXTENT
        expected.append(code)
    assert codes == expected
    assert {FAILED_POSITIONS, FAILED_EXTENT} <= {c & (FAILED_POSITIONS | FAILED_EXTENT) for c in codes}
    assert len({c for c in codes if c}) >= 4  # the draw hit several kinds of failure


def test_the_warp_codes_replayed_with_new_batches_and_bounds_match_torch():
    # The health kernels' launches are recorded once and replayed with new arguments: new
    # tensors, another number of systems and atoms, another extent bound, another dtype.
    pytest.importorskip("warp")
    from alchemi_core.dynamics.quarantine import HealthCheck, warp_codes

    g = torch.Generator().manual_seed(5)
    for trial in range(6):
        dtype = (torch.float32, torch.float64)[trial % 2]
        sizes = [int(x) for x in torch.randint(1, 6, (int(torch.randint(3, 40, (1,), generator=g)),), generator=g)]
        batch = make_batch(sizes, dtype=dtype)
        n = batch.num_nodes
        batch.set_field("forces", torch.randn(n, 3, generator=g).to(dtype), "node")
        batch.forces[torch.randint(0, n, (2,), generator=g), 0] = float("nan")
        batch.positions[torch.randint(0, n, (2,), generator=g)] += 50.0
        bound = 1.0e6 if trial % 3 == 0 else 30.0  # the extents flagged only under the small bound
        assert warp_codes(batch, bound) is not None
        warp = HealthCheck(max_extent=bound).codes(batch, backend="warp").tolist()
        assert warp == HealthCheck(max_extent=bound).codes(batch, backend="torch").tolist()
        assert any(warp), trial


@pytest.mark.parametrize("backend", ["torch", "warp"])
def test_each_systems_box_is_its_own_when_systems_lie_far_apart(backend):
    """Systems 100 Å apart, each a few Å wide, under a 50 Å bound: none is flagged, as no box
    takes in a neighbour's atoms (a Warp thread's atoms span several systems); moving one atom
    60 Å flags exactly its system."""
    from alchemi_core.dynamics.quarantine import HealthCheck, warp_codes

    if backend == "warp":
        pytest.importorskip("warp")
    sizes = [5, 17, 3, 40, 9, 2, 33, 11]
    batch = make_batch(sizes, dtype=torch.float64)
    batch.positions.add_(100.0 * batch.batch_idx.to(torch.float64)[:, None])
    if backend == "warp":
        assert warp_codes(batch, 50.0) is not None
    assert HealthCheck(max_extent=50.0).codes(batch, backend=backend).tolist() == [0] * len(sizes)
    batch.positions[sum(sizes[:3]) + 7, 1] += 60.0  # an atom of system 3
    expected = [FAILED_EXTENT if s == 3 else 0 for s in range(len(sizes))]
    assert HealthCheck(max_extent=50.0).codes(batch, backend=backend).tolist() == expected


def test_a_warp_build_without_cpu_kernels_falls_back_to_torch(monkeypatch):
    """Some warp-lang builds cannot compile CPU kernels (the GPU test host's lacks warp-clang):
    the checks of a CPU run then take the torch path instead of failing."""
    from alchemi_core.dynamics.quarantine import HealthCheck, warp_codes

    wp = pytest.importorskip("warp")
    monkeypatch.setattr(wp, "is_cpu_available", lambda: False)
    batch = make_batch([3, 4, 2], dtype=torch.float64)
    batch.positions[4, 0] = float("nan")
    assert warp_codes(batch, 1.0e4) is None
    assert HealthCheck().codes(batch).tolist() == [0, FAILED_POSITIONS, 0]


def test_the_health_kernels_follow_the_fields_in_place_and_when_replaced():
    """A check replays the launches with the arguments they hold when the batch's tensors are
    the same: values written in place between checks are seen, a field replaced by a new tensor
    is bound again, and the codes a caller holds are not overwritten by the next check."""
    pytest.importorskip("warp")
    from alchemi_core.dynamics.quarantine import FAILED_FORCES, FAILED_VELOCITIES, HealthCheck

    batch = make_batch([3, 4, 2], dtype=torch.float32)
    batch.set_field("forces", torch.zeros(9, 3), "node")
    batch.set_field("velocities", torch.zeros(9, 3), "node")
    check = HealthCheck()
    first = check.codes(batch)
    assert first.tolist() == [0, 0, 0]
    batch.forces[4, 1] = float("nan")  # in place: system 1
    assert check.codes(batch).tolist() == [0, FAILED_FORCES, 0]
    assert first.tolist() == [0, 0, 0]  # a held result is the caller's own
    batch.set_field("velocities", torch.zeros(9, 3), "node")  # a new tensor
    batch.velocities[8, 2] = float("inf")  # system 2
    assert check.codes(batch).tolist() == [0, FAILED_FORCES, FAILED_VELOCITIES]
    assert check.codes(batch, backend="torch").tolist() == [0, FAILED_FORCES, FAILED_VELOCITIES]
    fewer = batch.index_select([1, 2])  # other tensors and sizes, then the first batch again
    assert check.codes(fewer).tolist() == [FAILED_FORCES, FAILED_VELOCITIES]
    assert check.codes(batch).tolist() == [0, FAILED_FORCES, FAILED_VELOCITIES]


def test_a_health_check_read_later_marks_systems_by_id_once_even_when_the_batch_changed():
    from alchemi_core.dynamics.quarantine import FAILED_FORCES, FAILED_VELOCITIES, HealthCheck

    batch = make_batch([3, 4, 2], dtype=torch.float64)
    batch.set_field("forces", torch.zeros(9, 3, dtype=torch.float64), "node")
    batch.set_field("velocities", torch.zeros(9, 3, dtype=torch.float64), "node")
    batch.set_field("status", torch.zeros(3, dtype=torch.long), "system")
    batch.forces[4, 0] = float("nan")  # system 1
    batch.velocities[8, 2] = float("inf")  # system 2
    check = HealthCheck()
    pending = check.start(batch, torch.ones(3, dtype=torch.bool), step=99)
    assert batch.status.tolist() == [0, 0, 0]  # nothing changes until the codes are read
    later = batch.index_select([2, 0, 1])  # the systems moved
    later.status[0] = -FAILED_FORCES  # system 2 was quarantined meanwhile, for another reason
    found = check.settle(later, pending)
    assert [(q.system_id, q.step, q.status) for q in found] == [(1, 99, -FAILED_FORCES)]
    assert later.status.tolist() == [-FAILED_FORCES, 0, -FAILED_FORCES]
    assert check.settle(batch, check.start(batch, torch.tensor([True, False, True]), 5)) == [
        type(found[0])(2, 5, -FAILED_VELOCITIES)
    ]
