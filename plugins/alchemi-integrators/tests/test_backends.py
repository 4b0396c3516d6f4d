"""The production step (Warp kernels) takes the same steps as its torch oracle
(integrators_testkit/oracles.py; float64, to rounding), masks included.

Langevin's noise differs between the two by design (Warp draws it per system in-kernel), so
Langevin is compared at zero friction here and checked statistically in test_langevin.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from integrators_testkit.cases import CASES
from integrators_testkit.lj_reference import ReferenceLJ, argon
from integrators_testkit.oracles import implementation

from alchemi_core.data import Batch
from alchemi_core.dynamics import ConvergenceHook
from alchemi_integrators import CSVR, FIRE2, Langevin, NoseHooverChain, VelocityVerlet
from alchemi_integrators.thermo import initialize_velocities


def _start() -> Batch:
    batch = Batch.from_data_list([argon(2, rattle=0.05, seed=s) for s in range(3)])
    initialize_velocities(batch, 60.0, seed=5)
    return batch


@pytest.mark.parametrize(("cls", "kwargs"), CASES, ids=lambda c: c.__name__ if isinstance(c, type) else "")
def test_production_matches_the_oracle(cls: type, kwargs: dict[str, Any]) -> None:
    final = {}
    for backend in ("torch", "warp"):
        batch = _start()
        implementation(cls, backend)(ReferenceLJ(), n_steps=120, **kwargs).run(batch)
        final[backend] = batch
    torch_run, warp_run = final["torch"], final["warp"]
    assert (torch_run.positions - _start().positions).abs().max().item() > 1e-3  # they moved
    torch.testing.assert_close(warp_run.positions, torch_run.positions, rtol=0, atol=1e-12)
    torch.testing.assert_close(warp_run.velocities, torch_run.velocities, rtol=0, atol=1e-13)
    for name in ("fire_dt", "fire_alpha", "fire_positive_steps", "nhc_positions", "nhc_velocities", "csvr_noise_step",
                 "csvr_thermostat_energy", "status"):
        if name in torch_run:
            torch.testing.assert_close(getattr(warp_run, name), getattr(torch_run, name), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("second", [VelocityVerlet, NoseHooverChain, Langevin, CSVR])
def test_fused_relax_then_md_masks_agree(second: type) -> None:
    """FIRE2 then MD in one fused stage: systems switch stage at different steps, so every
    kernel runs with part of the batch masked out. Production and oracle end in the same state."""
    extra: dict[str, Any] = {"initial_temperature": 30.0, "random_seed": 9}
    if second is not VelocityVerlet:
        extra["temperature"] = 50.0
    if second is CSVR:
        extra["tau"] = 20.0
    if second is Langevin:
        # The oracle draws (zero-weighted) noise from the generator that also draws the
        # initial velocities, so with noise the draws would differ; start from FIRE's rest.
        extra = {"temperature": 50.0, "friction": 0.0}
    final = {}
    for backend in ("torch", "warp"):
        batch = _start()
        relax = implementation(FIRE2, backend)(ReferenceLJ(), n_steps=300, dt=5.0, dt_max=40.0,
                                               convergence_hook=ConvergenceHook.from_fmax(5e-3))
        md = implementation(second, backend)(ReferenceLJ(), n_steps=40, dt=5.0, **extra)
        out = (relax + md).run(batch)
        assert out.status.tolist() == [2, 2, 2]
        final[backend] = out
    assert len(set(final["torch"].fire_steps.tolist())) > 1  # systems left FIRE2 at different steps
    torch.testing.assert_close(final["warp"].positions, final["torch"].positions, rtol=0, atol=1e-11)
    torch.testing.assert_close(final["warp"].velocities, final["torch"].velocities, rtol=0, atol=1e-12)
