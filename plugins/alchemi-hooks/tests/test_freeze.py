"""FreezeAtomsHook: frozen atoms never move, under velocity Verlet and a noisy integrator."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import BaseDynamics, DemoDynamics, FusedStage, HostMemory, SizeAwareSampler
from alchemi_core.errors import ConfigurationError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_hooks.freeze import FreezeAtomsHook
from alchemi_hooks.observables import max_force


class NoisyEuler(BaseDynamics):
    """Kicks, drifts and random velocity noise, all through ``node_weight`` as the integrator
    API asks: a stand-in for Langevin-type integrators."""

    def pre_update(self, batch):
        w = self.context.node_weight
        noise = 0.01 * torch.randn_like(batch.velocities)
        batch.velocities.add_(noise if w is None else noise * w)
        batch.positions.add_(self.dt * (batch.velocities if w is None else batch.velocities * w))

    def post_update(self, batch):
        kick = self.dt * batch.forces * self.inv_mass
        w = self.context.node_weight
        batch.velocities.add_(kick if w is None else kick * w)


def assert_frozen_held(start, batch):
    frozen = batch.frozen
    assert frozen.any() and (~frozen).any()
    assert torch.equal(batch.positions[frozen], start[frozen])  # bit for bit
    assert torch.equal(batch.velocities[frozen], torch.zeros_like(batch.velocities[frozen]))
    assert torch.equal(batch.forces[frozen], torch.zeros_like(batch.forces[frozen]))
    assert (batch.positions[~frozen] - start[~frozen]).abs().max() > 1e-2


def test_frozen_atoms_do_not_move_in_velocity_verlet_md(molecules):
    batch = molecules([4, 6, 5], speed=0.03, frozen_every=2)  # frozen atoms start moving, too
    start = batch.positions.clone()
    DemoDynamics(model=DemoModelWrapper(), n_steps=200, dt=0.5, hooks=[FreezeAtomsHook()]).run(batch)
    assert_frozen_held(start, batch)


def test_frozen_atoms_do_not_move_under_a_noisy_integrator(molecules):
    torch.manual_seed(0)
    batch = molecules([4, 6], speed=0.03, frozen_every=3)
    start = batch.positions.clone()
    NoisyEuler(model=DemoModelWrapper(), n_steps=100, dt=0.5, hooks=[FreezeAtomsHook()]).run(batch)
    assert_frozen_held(start, batch)


def test_indices_are_written_to_the_frozen_field(molecules):
    batch = molecules([4, 5], speed=0.03)
    start = batch.positions.clone()
    DemoDynamics(model=DemoModelWrapper(), n_steps=50, dt=0.5, hooks=[FreezeAtomsHook(indices=[0, 2, 7])]).run(batch)
    assert batch.frozen.nonzero().flatten().tolist() == [0, 2, 7]
    assert_frozen_held(start, batch)


def test_fmax_counts_only_moving_atoms(molecules):
    batch = molecules([4, 5], frozen_every=2)
    DemoDynamics(model=DemoModelWrapper(), n_steps=5, dt=0.5, hooks=[FreezeAtomsHook()]).run(batch)
    forces = DemoModelWrapper()(batch)["forces"]
    forces[batch.frozen] = 0
    moving_max = torch.zeros(2).scatter_reduce(0, batch.batch_idx, forces.norm(dim=1), "amax")
    assert torch.allclose(max_force(batch), moving_max)


def test_frozen_atoms_are_held_in_every_stage_of_a_fused_stage(molecules):
    """``frozen`` belongs to the structure (like ASE's FixAtoms): the engine holds those atoms in
    every stage they pass through, also one without the hook."""
    batch = molecules([4, 6, 5], speed=0.03, frozen_every=2)
    batch.set_field("status", torch.tensor([0, 1, 1]), "system")
    start = batch.positions.clone()
    opt = DemoDynamics(model=DemoModelWrapper(), n_steps=30, dt=0.5)
    md = DemoDynamics(model=DemoModelWrapper(), n_steps=30, dt=0.5, hooks=[FreezeAtomsHook()])
    FusedStage([(0, opt), (1, md)]).run(batch)
    assert torch.equal(batch.positions[batch.frozen], start[batch.frozen])
    assert (batch.positions[~batch.frozen] - start[~batch.frozen]).abs().max() > 1e-3


def test_refilled_systems_are_held_from_their_first_step(molecule):
    data = [molecule(n, seed=i, speed=0.03, frozen_every=2) for i, n in enumerate([4, 6, 5, 3, 6, 4])]
    originals = {i: d.positions.clone() for i, d in enumerate(data)}
    sampler = SizeAwareSampler(ListDataset(data), max_atoms=12, max_batch_size=2, bin_width=1)
    sink = HostMemory(capacity=None)
    DemoDynamics(
        model=DemoModelWrapper(), n_steps=20, dt=0.5, sampler=sampler, sinks=[sink], refill_frequency=5,
        hooks=[FreezeAtomsHook()],
    ).run()
    out = sink.read()
    assert sorted(out.system_id.tolist()) == list(range(6))
    for row, sid in enumerate(out.system_id.tolist()):
        lo, hi = int(out.batch_ptr[row]), int(out.batch_ptr[row + 1])
        frozen = out.frozen[lo:hi]
        assert torch.equal(out.positions[lo:hi][frozen], originals[sid][frozen]), sid
        assert not torch.equal(out.positions[lo:hi][~frozen], originals[sid][~frozen]), sid


def test_nothing_to_freeze_is_an_error(molecules):
    md = DemoDynamics(model=DemoModelWrapper(), n_steps=2, hooks=[FreezeAtomsHook()])
    with pytest.raises(ConfigurationError, match="nothing to freeze"):
        md.run(molecules([3]))


def test_indices_beyond_the_batch_are_an_error(molecules):
    md = DemoDynamics(model=DemoModelWrapper(), n_steps=2, hooks=[FreezeAtomsHook(indices=[9])])
    with pytest.raises(ConfigurationError, match="beyond"):
        md.run(molecules([3]))
