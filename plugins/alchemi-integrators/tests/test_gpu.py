"""The same checks on a CUDA GPU: contracts, production = torch oracle, physics, streams, no host syncs.

Skipped without a GPU (conftest.py). Run on the GPU machine with ``-m gpu``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from integrators_testkit.cases import CASES
from integrators_testkit.lj_reference import ReferenceLJ, argon
from integrators_testkit.oracles import implementation
from integrators_testkit.recording import Record, integrated_autocorrelation_time

from alchemi_core.data import Batch
from alchemi_core.testing.gpu import no_host_sync
from alchemi_core.units import KB
from alchemi_integrators import CSVR, FIRE, FIRE2, LBFGS, Langevin, NoseHooverChain, VelocityVerlet
from alchemi_integrators.thermo import degrees_of_freedom, initialize_velocities, kinetic_energy

pytestmark = pytest.mark.gpu
CUDA = "cuda"


def _start(dtype: torch.dtype = torch.float64) -> Batch:
    batch = Batch.from_data_list([argon(2, rattle=0.05, seed=s, dtype=dtype) for s in range(3)]).to(CUDA)
    initialize_velocities(batch, 60.0, seed=5)
    batch.set_field("target", torch.full((3,), 300.0, dtype=dtype, device=CUDA), "system")
    return batch


@pytest.mark.parametrize(("cls", "kwargs"), CASES, ids=lambda c: c.__name__ if isinstance(c, type) else "")
def test_production_matches_the_oracle_on_gpu(cls: type, kwargs: dict[str, Any]) -> None:
    kwargs = {k: v.to(CUDA) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    final = {}
    for backend in ("torch", "warp"):
        batch = _start()
        implementation(cls, backend)(ReferenceLJ(), n_steps=120, **kwargs).run(batch)
        final[backend] = batch
    torch.testing.assert_close(final["warp"].positions, final["torch"].positions, rtol=0, atol=1e-11)
    torch.testing.assert_close(final["warp"].velocities, final["torch"].velocities, rtol=0, atol=1e-12)


def test_nve_float32_energy_on_gpu() -> None:
    """test_nve.py's bounds, float32, Warp kernels on the GPU."""
    batch = Batch.from_data_list([argon(2, dtype=torch.float32)]).to(CUDA)
    record = Record(lambda b, d: b.energy.view(-1).double() + kinetic_energy(b).double(), frequency=10)
    VelocityVerlet(ReferenceLJ(), n_steps=10_000, dt=5.0, initial_temperature=100.0, random_seed=0,
                   hooks=[record]).run(batch)
    energy = record.array()[:, 0]
    times = np.arange(len(energy)) * 50.0
    assert np.abs(energy - energy[0]).max() < 1e-3
    assert abs(np.polyfit(times, energy, 1)[0]) * 50_000 < 2e-4


def test_langevin_canonical_on_gpu() -> None:
    """test_langevin.py's canonical check, Warp kernels on the GPU, COM fixed."""
    systems, target = 8, 50.0
    batch = Batch.from_data_list([argon(2, rattle=0.02, seed=s) for s in range(systems)]).to(CUDA)
    record = Record(lambda b, d: kinetic_energy(b))
    Langevin(ReferenceLJ(), n_steps=3000, dt=5.0, temperature=target, friction=0.01, initial_temperature=target,
             random_seed=7, hooks=[record]).run(batch)
    ke = record.array()[300:]
    dof = degrees_of_freedom(batch)[0].item()
    n_eff = ke.size / np.mean([integrated_autocorrelation_time(ke[:, s]) for s in range(systems)])
    mean_t = (2.0 * ke / (dof * KB)).mean()
    assert abs(mean_t - target) < 0.02 * target
    ratio = ke.var(axis=0).mean() / (0.5 * dof * (KB * target) ** 2)
    assert abs(ratio - 1.0) < 3 * math.sqrt(2 / n_eff)


class Springs:
    """Atoms on springs to their start: a GPU model that never synchronises with the host."""

    def __init__(self, batch: Batch) -> None:
        self.home = batch.positions.clone()

    def __call__(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        d = batch.positions - self.home
        forces = torch.mul(d, -0.5, out=batch.forces)
        e = (d * d).sum(-1, keepdim=True) * 0.25
        energy = batch.energy.zero_().index_add_(0, batch.batch_idx, e)
        return {"energy": energy, "forces": forces}


#: Every MD and relaxation integrator (30 steps: ``run()`` ends on its own); the second Langevin
#: reads its temperature from the system field ``target`` (:func:`_start` gives it). Not BFGS, whose
#: eigendecomposition synchronises with the host (test_quasi_newton.py checks it refuses capture).
STEPPERS = [
    lambda m: VelocityVerlet(m, n_steps=30, dt=1.0),
    lambda m: Langevin(m, n_steps=30, dt=1.0, temperature=300.0),
    lambda m: Langevin(m, n_steps=30, dt=1.0, temperature="target", fix_com=False),
    lambda m: NoseHooverChain(m, n_steps=30, dt=1.0, temperature=300.0),
    lambda m: CSVR(m, n_steps=30, dt=1.0, temperature="target", tau=20.0),
    lambda m: FIRE(m, n_steps=30, dt=1.0),
    lambda m: FIRE2(m, n_steps=30, dt=1.0, maxstep_scope="system"),
    lambda m: LBFGS(m, n_steps=30, memory=10),
]


@pytest.mark.parametrize("make", STEPPERS)
def test_a_step_never_synchronises_with_the_host(make: Any) -> None:
    batch = _start()
    dynamics = make(Springs(batch))
    dynamics.step(batch)  # the first step prepares the run (allowed to read back)
    dynamics.step(batch)
    with no_host_sync():
        for _ in range(5):
            dynamics.step(batch)
    assert bool(torch.isfinite(batch.positions).all())


def test_kernels_run_on_torchs_current_stream() -> None:
    """On a side stream, with no synchronisation between the model's torch work and the
    integrator's Warp kernels except stream order, results equal the default stream's."""
    finals = []
    for use_side_stream in (False, True):
        batch = _start(torch.float32)
        nvt = Langevin(ReferenceLJ(), n_steps=200, dt=5.0, temperature=50.0, random_seed=3)
        if use_side_stream:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                nvt.run(batch)
            torch.cuda.current_stream().wait_stream(side)
        else:
            nvt.run(batch)
        torch.cuda.synchronize()
        finals.append(batch.positions.cpu())
    # Atomic sums may add in another order (float32): allow that, not a race's garbage.
    torch.testing.assert_close(finals[0], finals[1], rtol=0, atol=1e-4)



@pytest.mark.parametrize("make", STEPPERS)
def test_held_atoms_stay_without_host_syncs_and_in_a_captured_step(make: Any) -> None:
    """Held atoms and components (``frozen``, ``frozen_axes``) stay bit for bit on the GPU: in
    steps that never synchronise with the host, and in a step captured as a CUDA graph."""
    from alchemi_core.testing.contracts import assert_held, hold_some

    batch = _start()
    start, held = batch.positions.clone(), hold_some(batch)
    dynamics = make(_pulled(batch))
    dynamics.step(batch)  # the first step prepares the run (allowed to read back)
    dynamics.step(batch)
    with no_host_sync():
        for _ in range(5):
            dynamics.step(batch)
    assert_held(batch, held, start)

    batch = _start()
    start, held = batch.positions.clone(), hold_some(batch)
    stage = make(_pulled(batch)).compile()
    stage.run(batch)
    assert stage._engine.state.graph_captures >= 1
    assert_held(batch, held, start)


def _pulled(batch: Batch) -> Springs:
    """Springs to homes 0.05 Å away in each direction: every free atom feels a force."""
    springs = Springs(batch)
    springs.home += 0.05
    return springs
