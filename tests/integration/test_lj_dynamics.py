"""The whole stack on LJ argon: Warp potential + integrators + engine, against physics and ASE."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.build import bulk

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.dynamics import ConvergenceHook
from alchemi_core.units import ACCELERATION

EPS, SIG, RC = 0.0104, 3.405, 8.5125


def argon(repeat: int, n: int, rattle: float, dtype: torch.dtype) -> Batch:
    cells = []
    for seed in range(n):
        atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(repeat)
        atoms.positions += np.random.default_rng(seed).normal(scale=rattle, size=atoms.positions.shape)
        cells.append(atoms)
    return Batch.from_atoms(cells, dtype=dtype)


def total_energy(batch: Batch) -> torch.Tensor:
    ke = 0.5 * batch.atomic_masses * (batch.velocities.double() ** 2).sum(-1) / ACCELERATION
    return batch.energy.double().view(-1) + torch.zeros(batch.num_graphs, dtype=torch.float64).index_add_(
        0, batch.batch_idx, ke.double()
    )


@pytest.mark.parametrize("dtype, bound", [(torch.float64, 2e-4), (torch.float32, 5e-4)])
def test_nve_with_the_warp_potential_conserves_energy(dtype, bound):
    from alchemi_integrators.thermo import initialize_velocities

    batch = argon(2, 2, 0.0, dtype)
    initialize_velocities(batch, 50.0, seed=1)
    model = registry.build("model:lennard-jones", epsilon=EPS, sigma=SIG, cutoff=RC, shift_energy=True)
    nve = registry.build("integrator:velocity-verlet", model=model, n_steps=1, dt=5.0)
    nve.run(batch)
    e0 = total_energy(batch)
    nve.run(batch, n_steps=1500)
    # 32 atoms at 50 K (kinetic energy ~0.2 eV per cell): velocity Verlet's energy error at 5 fs
    # is bounded (measured 8e-5 eV in float64, 4e-5 eV in float32 over 7.5 ps), with no drift;
    # the bounds leave room for round-off without hiding a wrong force or a broken update.
    assert float((total_energy(batch) - e0).abs().max()) < bound


def test_fire_with_the_warp_potential_matches_ase_fire():
    from ase.calculators.lj import LennardJones
    from ase.optimize import FIRE as AseFIRE

    batch = argon(2, 3, 0.1, torch.float64)
    model = registry.build("model:lennard-jones", epsilon=EPS, sigma=SIG, cutoff=RC, shift_energy=True)
    fire = registry.build("integrator:fire", model=model, n_steps=2000, dt=5.0, dt_max=50.0,
                          convergence_hook=ConvergenceHook.from_fmax(1e-3))
    out = fire.run(batch)
    assert out.status.tolist() == [1, 1, 1]
    for i, _ in enumerate(batch.to_atoms()):
        start = argon(2, 3, 0.1, torch.float64).to_atoms()[i]
        start.calc = LennardJones(sigma=SIG, epsilon=EPS, rc=RC, smooth=False)
        AseFIRE(start, logfile=None).run(fmax=1e-3, steps=5000)
        assert float(out.energy[i, 0]) == pytest.approx(start.get_potential_energy(), abs=1e-4)
        assert float(out.fmax[i]) <= 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fire_replayed_as_a_cuda_graph_matches_eager():
    """Converged systems stop moving when the step is replayed from a CUDA graph too (a graph
    replay skips the integrator's Python, so stale mask-derived values once kept them moving)."""
    results = []
    for compiled in (False, True):
        batch = argon(3, 64, 0.1, torch.float32).to("cuda")
        model = registry.build("model:lennard-jones", epsilon=EPS, sigma=SIG, cutoff=RC, max_neighbors=128)
        fire = registry.build("integrator:fire", model=model, n_steps=500, dt=5.0, dt_max=50.0,
                              convergence_hook=ConvergenceHook.from_fmax(0.05, frequency=1))
        if compiled:
            fire = fire.compile()
        with fire:
            results.append(fire.run(batch))
    eager, graphed = results
    assert graphed.status.tolist() == eager.status.tolist() == [1] * 64
    final = registry.build("model:lennard-jones", epsilon=EPS, sigma=SIG, cutoff=RC)(graphed.clone())["forces"]
    assert float(torch.linalg.vector_norm(final, dim=-1).max()) <= 0.05
    torch.testing.assert_close(graphed.positions, eager.positions, atol=1e-4, rtol=0)
