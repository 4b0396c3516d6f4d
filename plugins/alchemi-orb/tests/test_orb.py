"""model:orb against ORB's own ASE calculator (ORBCalculator) on the same networks, and its errors."""

from __future__ import annotations

import copy

import pytest
import torch
from alchemi_orb import OrbModel
from alchemi_orb.testing import mixed_structures, saved_and_loaded

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_potentials.testing import compare_with_calculator


def _calculator(network, adapter):
    from orb_models.forcefield.inference.calculator import ORBCalculator

    return ORBCalculator(network, adapter, device="cpu")


@pytest.mark.parametrize("kind", ["conservative", "direct"])
def test_float32_batch_equals_orb_calculator(kind, request):
    """Four systems of 16, 8, 5 and 12 atoms in one batch; each alone equals itself in the batch."""
    network, adapter = request.getfixturevalue(kind)
    model = OrbModel(network, atoms_adapter=adapter)
    assert model.conservative == (kind == "conservative")
    compare_with_calculator(model, _calculator(network, adapter), mixed_structures(), torch.float32,
                            energy_tol=1e-4, force_tol=1e-5, stress_tol=1e-6)


def test_float64_batch_equals_orb_calculator(tmp_path):
    network, adapter = saved_and_loaded("conservative", tmp_path, seed=2, dtype=torch.float64)
    model = OrbModel(copy.deepcopy(network), atoms_adapter=adapter, dtype="float64")
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # ORB's calculator builds its graph in the default dtype
    try:
        worst = compare_with_calculator(model, _calculator(network, adapter), mixed_structures(), torch.float64,
                                        energy_tol=1e-8, force_tol=1e-8, stress_tol=1e-8)
    finally:
        torch.set_default_dtype(default)
    assert worst["forces"] < 1e-8


def test_fewer_neighbours_change_the_graph_as_in_orb(conservative):
    """max_num_neighbors=20 (the orb-v3 "-20" models): ORB's nearest-neighbour graph, not a radius graph."""
    network, adapter = conservative
    from orb_models.forcefield.forcefield_adapter import ForcefieldAtomsAdapter

    twenty = ForcefieldAtomsAdapter(radius=6.0, max_num_neighbors=20)
    model = OrbModel(network, atoms_adapter=twenty)
    compare_with_calculator(model, _calculator(network, twenty), mixed_structures()[:2], torch.float32,
                            energy_tol=1e-4, force_tol=1e-5, stress_tol=1e-6)
    batch = Batch.from_atoms(mixed_structures()[:1], dtype=torch.float32)
    full = OrbModel(network, atoms_adapter=adapter)(batch)["energy"]
    assert (model(batch)["energy"] - full).abs().item() > 1e-3


def test_partly_periodic_systems_are_refused(conservative):
    model = OrbModel(*conservative[:1], atoms_adapter=conservative[1])
    atoms = mixed_structures()
    atoms[3].pbc = (True, True, False)
    with pytest.raises(InvalidDataError, match=r"systems \[3\] are periodic along some axes only"):
        model(Batch.from_atoms(atoms, dtype=torch.float32))


def test_bad_arguments_are_configuration_errors(conservative, tmp_path):
    network, adapter = conservative
    with pytest.raises(ConfigurationError, match="float32' or 'float64'"):
        OrbModel(network, atoms_adapter=adapter, dtype="float16")
    with pytest.raises(ConfigurationError, match="needs its atoms_adapter"):
        OrbModel(network)
    with pytest.raises(ConfigurationError, match="expected an ORB forcefield"):
        OrbModel(torch.nn.Linear(2, 2), atoms_adapter=adapter)
    with pytest.raises(ConfigurationError, match="neither a published ORB model"):
        registry.build("model:orb", model="orb-v9")
    weights = tmp_path / "w.ckpt"
    weights.write_bytes(b"")
    with pytest.raises(ConfigurationError, match="name its architecture with architecture="):
        OrbModel(str(weights))


def test_species_beyond_orbs_embedding_are_refused(conservative):
    model = OrbModel(conservative[0], atoms_adapter=conservative[1])
    batch = Batch.from_atoms(mixed_structures()[1:2], dtype=torch.float32)
    batch.atomic_numbers[0] = 118
    with pytest.raises(InvalidDataError, match=r"no parameters for atomic numbers \[118\]"):
        model(batch)


def test_charge_and_spin_condition_the_network_as_in_orb(tmp_path):
    """An OrbMol-like network (charge and spin conditioning) reads each system's charge and spin."""
    network, adapter = saved_and_loaded("conservative", tmp_path, seed=4, has_charge_spin_cond=True)
    model = OrbModel(network, atoms_adapter=adapter)
    assert model.card.needs_charge and model.card.needs_spin
    structures = mixed_structures()
    for i, atoms in enumerate(structures):
        atoms.info.update(charge=i % 2, spin=1 + i % 3)
    compare_with_calculator(model, _calculator(network, adapter), structures, torch.float32,
                            energy_tol=1e-4, force_tol=1e-5, stress_tol=1e-6)
    batch = Batch.from_atoms(structures, dtype=torch.float32)
    recharged = Batch.from_atoms(structures, dtype=torch.float32)
    recharged.charge[0] += 1
    assert (model(recharged)["energy"][0] - model(batch)["energy"][0]).abs().item() > 1e-4
    for atoms in structures:
        del atoms.info["charge"]
    with pytest.raises(InvalidDataError, match="needs each structure's total charge"):
        model(Batch.from_atoms(structures, dtype=torch.float32))


def test_the_same_as_orbs_torchsim_wrapper(conservative):
    """model:orb gives what orb-models' OrbTorchSimModel gives on the same network (W7 compares
    the two): energies, forces and stress of the periodic structures in one batch."""
    ts = pytest.importorskip("torch_sim")
    from orb_models.forcefield.inference.orb_torchsim import OrbTorchSimModel

    network, adapter = conservative
    periodic = [a for a in mixed_structures() if a.pbc.all()]  # a TorchSim state has one pbc
    theirs = OrbTorchSimModel(network, adapter, device="cpu", dtype=torch.float32)(
        ts.io.atoms_to_state(periodic, torch.device("cpu"), torch.float32))
    ours = OrbModel(network, atoms_adapter=adapter)(Batch.from_atoms(periodic, dtype=torch.float32),
                                                    compute_stress=True)
    torch.testing.assert_close(ours["energy"].view(-1), theirs["energy"].view(-1).float(), rtol=0, atol=1e-4)
    torch.testing.assert_close(ours["forces"], theirs["forces"], rtol=0, atol=1e-5)
    torch.testing.assert_close(ours["stress"], theirs["stress"], rtol=0, atol=1e-6)
