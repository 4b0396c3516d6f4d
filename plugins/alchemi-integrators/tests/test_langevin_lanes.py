"""Langevin's CPU step with a system's atoms in SIMD lanes (``alchemi_integrators.langevin_lanes``):
Warp's own Gaussian draws, the general Warp path's trajectory, the same bits in ranges."""

from __future__ import annotations

import pytest
import torch
from integrators_testkit.lj_reference import ReferenceLJ, argon

from alchemi_core.data import AtomicData, Batch
from alchemi_integrators import Langevin
from alchemi_integrators.base import warp_available
from alchemi_integrators.thermo import center_of_mass_velocity

pytestmark = pytest.mark.skipif(not warp_available(), reason="needs warp-lang")


class FreeAtoms:
    """Zero forces: one step from rest leaves each velocity component at its noise alone."""

    def __call__(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        return {"energy": batch.energy.zero_(), "forces": batch.forces.zero_()}


def _step_with(monkeypatch, lanes: bool, make_batch, **kwargs) -> tuple[Batch, set[str]]:
    from alchemi_integrators import langevin_lanes

    monkeypatch.setitem(langevin_lanes.BY_DEVICE, "cpu", lanes)
    batch = make_batch()
    dyn = Langevin(backend="warp", **kwargs)
    dyn.run(batch)
    return batch, set(dyn._warp_launches._recorded)


def test_the_draws_are_warps_gaussians(monkeypatch) -> None:
    """Free atoms from rest, one step without the COM held: each velocity component is its draw
    times sigma. The lanes' draws (Warp's generator, ``log`` and ``cos`` as polynomials) must be
    the general path's (Warp's ``randn``) draw for draw, over 60,000 draws in systems whose sizes
    leave partial blocks of lanes (1, 13 and 19,986 atoms): a wrong key, counter or polynomial
    fails this."""

    def make() -> Batch:
        systems = [AtomicData(atomic_numbers=torch.full((n,), 18), positions=torch.zeros(n, 3, dtype=torch.float64))
                   for n in (1, 13, 19986)]
        return Batch.from_data_list(systems)

    kwargs = {"model": FreeAtoms(), "n_steps": 1, "dt": 2.0, "temperature": 300.0, "friction": 0.05,
              "random_seed": 11, "fix_com": False}
    lanes, launched = _step_with(monkeypatch, True, make, **kwargs)
    general, launched_general = _step_with(monkeypatch, False, make, **kwargs)
    assert "baoa_lanes" in launched and "baoa" not in launched
    assert "baoa" in launched_general and "baoa_lanes" not in launched_general
    sigma = general.velocities.std().item()
    assert sigma > 0
    error = ((lanes.velocities - general.velocities).abs() / sigma).max().item()
    # Both draw in float32. Warp forms the angle 2 pi u2 in float32 (off by up to 4e-7 rad) and
    # scales its cosine by a radius of up to 5.8; the lanes fold u2 exactly. 1.2e-6 here.
    assert error < 4e-6, error
    draws = lanes.velocities / sigma
    assert abs(draws.mean().item()) < 0.02 and abs(draws.var().item() - 1.0) < 0.03
    assert draws.abs().max().item() > 3.5  # the tails are there (60,000 draws reach past 4)


@pytest.mark.parametrize("fix_com", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_lanes_follow_the_general_paths_trajectory(monkeypatch, fix_com: bool, dtype: torch.dtype) -> None:
    """Argon cells of 4, 32, 4 and 108 atoms, 12 steps: the lanes (then torch's last half-kick)
    and the general Warp path (four launches with the COM held) agree to the rounding of the
    draws and of the momentum sums' order, and each system's centre of mass stays at rest when
    held."""

    def make() -> Batch:
        return Batch.from_data_list([argon(n, rattle=0.05, seed=s, dtype=dtype) for s, n in enumerate((1, 2, 1, 3))])

    kwargs = {"model": ReferenceLJ(), "n_steps": 12, "dt": 5.0, "temperature": 80.0, "friction": 0.05,
              "random_seed": 3, "fix_com": fix_com}
    start = make().positions
    lanes, _ = _step_with(monkeypatch, True, make, **kwargs)
    general, _ = _step_with(monkeypatch, False, make, **kwargs)
    assert (lanes.positions - start).abs().amin(dim=1).gt(0).all()  # every atom moved
    # Each system's step count keys its draws: the lanes count it in their launch, the general
    # path in its last half-kick; one count a step either way.
    assert lanes.langevin_noise_step.tolist() == general.langevin_noise_step.tolist() == [12] * 4
    v_scale = general.velocities.abs().max().item()
    atol_x, rtol_v = (1e-7, 1e-5) if dtype == torch.float64 else (5e-6, 1e-4)
    torch.testing.assert_close(lanes.positions, general.positions, rtol=0, atol=atol_x)
    torch.testing.assert_close(lanes.velocities, general.velocities, rtol=0, atol=rtol_v * v_scale)
    if fix_com:
        limit = 1e-12 if dtype == torch.float64 else 1e-7 * v_scale
        assert center_of_mass_velocity(lanes).abs().max().item() < limit


def test_ranges_of_systems_give_the_one_launch_bits(monkeypatch) -> None:
    """From ``CHUNKED_FROM`` atoms the systems run in ranges on the CPU's threads; each system is
    one thread's, so the trajectory is bit for bit the one launch's."""
    from alchemi_integrators import langevin_lanes

    finals = []
    for ranges_from in (10**9, 0):
        for handoff in ("spinning", "sleeping"):
            monkeypatch.setitem(langevin_lanes.CHUNKED_FROM, handoff, ranges_from)
        monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
        batch = Batch.from_data_list([argon(2, rattle=0.05, seed=s) for s in range(11)])
        dyn = Langevin(ReferenceLJ(), n_steps=10, dt=5.0, temperature=80.0, friction=0.05, random_seed=3,
                       backend="warp")
        dyn.run(batch)
        chunks = dyn._warp_launches._recorded["baoa_lanes"][2]._commands[0]
        assert isinstance(chunks, tuple) == (ranges_from == 0)  # ranges only when asked
        finals.append((batch.positions.clone(), batch.velocities.clone()))
    assert torch.equal(finals[0][0], finals[1][0]) and torch.equal(finals[0][1], finals[1][1])
