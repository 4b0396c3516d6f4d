"""Integrators inside fused stages: each moves only its own systems, and MD stages can give
relaxed systems fresh thermal velocities as they enter."""

from __future__ import annotations

import pytest
import torch
from integrators_testkit.lj_reference import ReferenceLJ, argon
from integrators_testkit.oracles import implementation
from integrators_testkit.recording import Record

from alchemi_core.data import Batch
from alchemi_core.dynamics import ConvergenceHook
from alchemi_core.dynamics.context import StepContext
from alchemi_integrators import CSVR, FIRE, Langevin, VelocityVerlet
from alchemi_integrators.thermo import center_of_mass_velocity, initialize_velocities, temperature

#: Production (Warp) and its torch oracle (integrators_testkit/oracles.py).
BACKENDS = ["torch", "warp"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_stage_moves_only_its_systems(backend: str, core_tuning) -> None:
    """System 0 starts in a velocity Verlet stage, system 1 in a Langevin stage (30 steps each).
    For its first 30 steps system 0 follows a plain velocity Verlet run exactly, although
    Langevin's noisy update runs on the same batch; system 1, once graduated, never moves again."""
    start = Batch.from_data_list([argon(1, rattle=0.1, seed=0), argon(1, rattle=0.1, seed=1)])
    initialize_velocities(start, 60.0, seed=2)
    batch = start.clone()
    batch.set_field("status", torch.tensor([0, 1]), "system")
    positions = Record(lambda b, d: b.positions.view(-1))
    nve = implementation(VelocityVerlet, backend)(ReferenceLJ(), n_steps=30, dt=5.0, hooks=[positions], tuning=core_tuning)
    nvt = implementation(Langevin, backend)(ReferenceLJ(), n_steps=30, dt=5.0, temperature=300.0, friction=0.1, tuning=core_tuning)
    (nve + nvt).run(batch)
    track = torch.tensor(positions.array()).view(-1, 8, 3)
    alone = start.index_select([0])
    implementation(VelocityVerlet, backend)(ReferenceLJ(), n_steps=30, dt=5.0, tuning=core_tuning).run(alone)
    torch.testing.assert_close(track[29, :4], alone.positions, rtol=0, atol=1e-12)
    assert not torch.allclose(track[40, :4], track[29, :4])  # then it moved on in Langevin
    assert (track[29, 4:] - track[0, 4:]).abs().max() > 1e-3  # system 1 moved while in Langevin
    assert torch.equal(track[30, 4:], track[-1, 4:])  # and never after it graduated


@pytest.mark.parametrize(("md_class", "thermostat"), [(Langevin, {"friction": 0.01}), (CSVR, {"tau": 100.0})],
                         ids=["langevin", "csvr"])
def test_relaxed_systems_enter_md_at_the_initial_temperature(md_class: type, thermostat: dict, core_tuning) -> None:
    """FIRE then an NVT stage with initial_temperature: each system gets Maxwell-Boltzmann velocities
    with no COM motion when it enters MD (at its own step), instead of FIRE's near-zero ones."""
    batch = Batch.from_data_list([argon(2, rattle=0.1, seed=s) for s in range(4)])
    temps = Record(lambda b, d: temperature(b) * (b.status == d.status_code).to(b.positions.dtype))
    relax = FIRE(ReferenceLJ(), n_steps=500, dt=5.0, dt_max=50.0, convergence_hook=ConvergenceHook.from_fmax(0.05), tuning=core_tuning)
    md = md_class(ReferenceLJ(), n_steps=20, dt=5.0, temperature=40.0, initial_temperature=40.0,
                  random_seed=1, hooks=[temps], tuning=core_tuning, **thermostat)
    out = (relax + md).run(batch)
    assert out.status.tolist() == [2, 2, 2, 2]
    t = temps.array()
    first_md = [(t[:, s] > 0).argmax() for s in range(4)]
    entry = torch.tensor([t[i, s] for s, i in enumerate(first_md)])
    # 93 degrees of freedom: the instantaneous temperature is 40 K +- 15 %, FIRE's is ~0.
    assert torch.all((entry > 20.0) & (entry < 60.0)), entry
    assert center_of_mass_velocity(out).abs().max().item() < 1e-12


def test_the_engine_brings_derived_values_to_the_new_masks_in_place(core_tuning) -> None:
    """A captured step keeps reading the tensors it was captured with. After system 0 leaves the
    Langevin stage, the engine's mask rewrite rebuilds those same tensors (``StepContext.derived``)
    to what a stage that started with system 0 already gone computes. (The stage is compiled: only
    a run that may replay a captured step keeps the builds; on a CPU it steps eagerly all the same.)"""

    def stages() -> tuple[Langevin, object]:
        nvt = Langevin(ReferenceLJ(), n_steps=50, dt=5.0, temperature=300.0, friction=0.1, tuning=core_tuning)
        return nvt, (nvt + VelocityVerlet(ReferenceLJ(), n_steps=50, dt=5.0, tuning=core_tuning)).compile()

    def start(status: list[int]) -> Batch:
        batch = Batch.from_data_list([argon(1, rattle=0.1, seed=0), argon(1, rattle=0.1, seed=1)])
        initialize_velocities(batch, 60.0, seed=2)
        batch.set_field("status", torch.tensor(status), "system")
        return batch

    nvt, fused = stages()
    batch = start([0, 0])
    fused.step(batch)
    values = nvt.context._derived
    held = {name: hit[0] for name, hit in values.items()}
    assert all(hit[1] is not None for hit in values.values())  # the builds kept
    assert "active" in held
    batch.status[0] = 1
    fused._engine.masks.update(batch)

    ref_nvt, ref_fused = stages()
    ref_fused.step(start([1, 0]))
    assert set(ref_nvt.context._derived) <= set(held)
    for name, (expected, *_) in ref_nvt.context._derived.items():
        now = values[name][0]
        for got, want, was in zip(_flat(now), _flat(expected), _flat(held[name])):
            if isinstance(got, torch.Tensor):
                assert got is was, f"{name} was replaced, not refreshed in place"
                torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)
            else:
                assert got == want, name
    assert values["active"][0].tolist() == [0.0, 1.0]


def _flat(value: object) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def test_values_that_do_not_read_the_masks_outlive_a_mask_rewrite_but_not_a_change_of_systems(core_tuning) -> None:
    """``cached(masks=False)`` (parameter broadcasts, masses) is kept when the engine rewrites the
    masks and dropped when the batch's systems change; a value that reads the masks is rebuilt
    in place at a rewrite (where the run keeps the builds)."""
    batch = Batch.from_data_list([argon(1, rattle=0.1, seed=s) for s in range(3)])
    fire = FIRE(ReferenceLJ(), n_steps=10, dt=5.0, tuning=core_tuning)
    fire.context = StepContext.standalone(batch)
    fire.context.keeps_builds = True
    builds: list[str] = []

    def value(name: str, masks: bool) -> torch.Tensor:
        def build() -> torch.Tensor:
            builds.append(name)
            return torch.full((batch.num_graphs,), 1.0)

        return fire.cached(name, batch, build, reads_fields=False, masks=masks)

    first = value("systems", False), value("masks", True)
    assert fire.context.refresh_derived(systems_changed=False)  # the masks were rewritten
    again = value("systems", False), value("masks", True)
    assert builds == ["systems", "masks", "masks"]
    assert again[0] is first[0] and again[1] is first[1]  # rebuilt in place
    batch.defrag(torch.tensor([True, False, False]))  # a system left: the systems changed
    assert fire.context.refresh_derived(systems_changed=True)
    assert value("systems", False).shape == (2,)
    assert builds[-1] == "systems"


def test_a_check_sets_up_stages_only_for_systems_that_enter_one() -> None:
    """A relaxation's converged systems leave the engine: its checks never ask FIRE to set up
    newcomers (only the run's start does). Relaxed systems that enter MD in a fused stage get
    Langevin's set-up at the check that moves them."""
    calls = {"FIRE": 0}
    entered = torch.zeros(4, dtype=torch.bool)

    class CountingFIRE(FIRE):
        def init_state(self, batch: Batch, entering: torch.Tensor) -> None:
            calls["FIRE"] += 1
            super().init_state(batch, entering)

    class CountingLangevin(Langevin):
        def init_state(self, batch: Batch, entering: torch.Tensor) -> None:
            entered.logical_or_(entering)
            super().init_state(batch, entering)

    def relax() -> FIRE:
        return CountingFIRE(ReferenceLJ(), n_steps=500, dt=5.0, dt_max=50.0,
                            convergence_hook=ConvergenceHook.from_fmax(0.05))

    out = relax().run(Batch.from_data_list([argon(2, rattle=0.1, seed=s) for s in range(4)]))
    assert out.status.tolist() == [1, 1, 1, 1] and calls["FIRE"] == 1
    md = CountingLangevin(ReferenceLJ(), n_steps=5, dt=5.0, temperature=40.0, friction=0.01, random_seed=1)
    calls["FIRE"] = 0
    out = (relax() + md).run(Batch.from_data_list([argon(2, rattle=0.1, seed=s) for s in range(4)]))
    assert out.status.tolist() == [2, 2, 2, 2]
    assert entered.all()  # each system got its MD set-up on the way in
