"""Resuming a stochastic integrator from a checkpoint continues its random stream exactly."""

from __future__ import annotations

import torch
from ase.build import bulk

from alchemi_core import registry
from alchemi_core.data import Batch


def test_langevin_resumes_its_noise(tmp_path):
    def stage():
        model = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5125)
        return registry.build("integrator:langevin", model=model, n_steps=30, dt=5.0, temperature=50.0,
                              friction=0.01, initial_temperature=50.0, random_seed=7)

    cells = [bulk("Ar", "fcc", a=5.26, cubic=True).repeat(2) for _ in range(2)]
    whole = stage().run(Batch.from_atoms(cells, dtype=torch.float64))
    stage().run(Batch.from_atoms(cells, dtype=torch.float64), n_steps=13, checkpoint=tmp_path / "l.ckpt")
    resumed = stage().run(resume_from=tmp_path / "l.ckpt")
    torch.testing.assert_close(resumed.positions, whole.positions, rtol=0, atol=1e-12)
    torch.testing.assert_close(resumed.velocities, whole.velocities, rtol=0, atol=1e-12)
