"""Electrostatics inside alchemi's engine: model:sum of Lennard-Jones and Ewald in a fused
FIRE + Langevin stage, and charges handed on by a model that predicts them."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.data import Batch
from alchemi_core.dynamics import ConvergenceHook
from alchemi_core.errors import InvalidDataError
from alchemi_electrostatics import DSF, PME, Ewald
from alchemi_integrators import FIRE, Langevin
from alchemi_integrators.thermo import temperature
from alchemi_potentials import LennardJones, SumModel


def ionic_model() -> SumModel:
    # Lennard-Jones for the repulsion at contact, Ewald for the ions' charges.
    return SumModel([LennardJones(epsilon=0.5, sigma=2.7, cutoff=7.0, shift_energy=True), Ewald(cutoff=7.0)])


def test_fire_then_langevin_on_lennard_jones_plus_ewald(nacl):
    crystals = [nacl.copy(), nacl.repeat((2, 1, 1))]
    for seed, atoms in enumerate(crystals):
        atoms.rattle(0.15, seed=seed)
    batch = Batch.from_atoms(crystals, dtype=torch.float64)
    model = ionic_model()
    start = model(batch.clone())["energy"].clone()
    relax = FIRE(model, n_steps=400, dt=1.0, dt_max=5.0, convergence_hook=ConvergenceHook.from_fmax(0.02))
    md = Langevin(model, n_steps=30, dt=2.0, temperature=300.0, friction=0.02, initial_temperature=300.0,
                  random_seed=3)
    out = (relax + md).run(batch)
    assert out.status.tolist() == [2, 2]  # both relaxed, then ran their MD steps
    assert torch.isfinite(out.positions).all()
    assert (model(out.clone())["energy"] < start).all()  # lower than rattled, after relaxing and 30 steps at 300 K
    assert ((temperature(out) > 20.0) & (temperature(out) < 2000.0)).all()


class PredictedCharges(torch.nn.Module):
    """A stand-in for an MLIP that predicts charges: +1 e on Na, -1 e on Cl, no energy."""

    def forward(self, batch, compute_stress=False):
        q = torch.where(batch.atomic_numbers == 11, 1.0, -1.0).to(batch.positions.dtype)
        out = {"energy": torch.zeros(batch.num_graphs, 1, dtype=q.dtype), "forces": torch.zeros_like(batch.positions),
               "charges": q}
        if compute_stress:
            out["stress"] = torch.zeros(batch.num_graphs, 3, 3, dtype=q.dtype)
        return out


@pytest.mark.parametrize("method", [Ewald, PME, DSF])
def test_charges_a_model_predicts_reach_the_electrostatics_in_a_sum(nacl, method):
    given = Batch.from_atoms([nacl.repeat((1, 1, 2))], dtype=torch.float64)
    plain = nacl.repeat((1, 1, 2))
    plain.set_initial_charges(None)
    bare = Batch.from_atoms([plain], dtype=torch.float64)
    assert "initial_charges" not in bare
    with pytest.raises(InvalidDataError, match="needs per-atom charges.*set_initial_charges"):
        method()(bare)
    summed = SumModel([PredictedCharges(), method()])(bare, compute_stress=True)
    reference = method()(given, compute_stress=True)
    for key in ("energy", "forces", "stress"):
        torch.testing.assert_close(summed[key], reference[key], rtol=0, atol=1e-10)
    assert summed["charges"].tolist() == given.initial_charges.tolist()
