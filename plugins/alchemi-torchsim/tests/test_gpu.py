"""model:torchsim on a GPU: TorchSim's Lennard-Jones and MACE's TorchSim wrapper on CUDA equal
their own calls through TorchSim, in a fused relax and MD run too; a model built on another
device is refused, naming it."""

from __future__ import annotations

import pytest
import torch
import torch_sim as ts
from ase.build import bulk

from alchemi_core.data import Batch
from alchemi_core.dynamics import ConvergenceHook
from alchemi_core.errors import InvalidDataError
from alchemi_integrators import FIRE, Langevin
from alchemi_torchsim import TorchSimModel
from alchemi_torchsim.testing import ARGON, small_mace

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")


def _lennard_jones(device: torch.device):
    from torch_sim.models.lennard_jones import LennardJonesModel

    return LennardJonesModel(**ARGON, device=device, dtype=torch.float64, compute_stress=True)


def _mace(device: torch.device):
    from mace.calculators.mace_torchsim import MaceTorchSimModel

    return MaceTorchSimModel(small_mace(), device=device, dtype=torch.float64, compute_stress=True)


def _crystals(symbol: str, a: float):
    systems = [bulk(symbol, "fcc", a=a, cubic=True).repeat(r) for r in [(2, 2, 2), (1, 1, 1), (2, 1, 1)]]
    for seed, atoms in enumerate(systems):
        atoms.rattle(0.05, seed=seed)
    return systems


@pytest.mark.parametrize(("make", "symbol", "a"), [(_lennard_jones, "Ar", 5.26), (_mace, "Cu", 3.61)],
                         ids=["lennard-jones", "mace"])
def test_cuda_equals_torchsim_and_a_fused_run_keeps_equal_energies(make, symbol, a):
    ts_model = make(CUDA)
    structures = _crystals(symbol, a)
    batch = Batch.from_atoms(structures, dtype=torch.float64, device="cuda")
    model = TorchSimModel(ts_model)
    out = model(batch, compute_stress=True)
    ref = ts_model(ts.io.atoms_to_state(structures, device=CUDA, dtype=torch.float64))
    for key in ("energy", "forces", "stress"):
        torch.testing.assert_close(out[key].view_as(ref[key]), ref[key], rtol=0, atol=1e-9)
    relax = FIRE(model, n_steps=100, dt=2.0, convergence_hook=ConvergenceHook.from_fmax(0.05))
    md = Langevin(model, n_steps=10, dt=1.0, temperature=50.0, friction=0.02, random_seed=0)
    done = (relax + md).run(batch)
    again = ts_model(ts.io.atoms_to_state(done.to_atoms(), device=CUDA, dtype=torch.float64))
    torch.testing.assert_close(done.energy.view(-1), again["energy"], rtol=0, atol=1e-9)


def test_a_model_on_the_cpu_refuses_a_batch_on_the_gpu():
    batch = Batch.from_atoms(_crystals("Ar", 5.26)[:1], dtype=torch.float64, device="cuda")
    with pytest.raises(InvalidDataError, match=r"batch is on cuda.*built on cpu.*device='cuda"):
        TorchSimModel(_lennard_jones(torch.device("cpu")))(batch)


def test_the_memory_per_atom_is_measured_on_the_gpu_and_planned_with():
    batch = Batch.from_atoms(_crystals("Cu", 3.61), dtype=torch.float64, device="cuda")
    model = TorchSimModel(_mace(CUDA))
    measured = model.measure_bytes_per_atom(batch)
    assert measured > 8192 and model.bytes_per_atom() == measured  # a network's activations: more than the guess
