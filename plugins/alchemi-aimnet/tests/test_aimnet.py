"""model:aimnet2 against aimnet's own ASE calculator on the same model file (random weights):
neutral and charged molecules and a periodic box in one batch, charge changes, and the engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.errors import ConfigurationError, InvalidDataError

#: float32 bounds: energies of 100-400 eV carry float32 rounding of about 3e-5 eV; forces and
#: partial charges are float32 throughout (aimnet's and alchemi's alike).
ENERGY_TOL, FORCE_TOL, CHARGE_TOL, STRESS_TOL = 1e-4, 1e-5, 1e-5, 1e-6


def reference(model_path):
    """aimnet's ASE calculator on ``model_path`` (the CPU, as the batch)."""
    from aimnet.calculators import AIMNet2ASE, AIMNet2Calculator

    return AIMNet2ASE(AIMNet2Calculator(model_path, device="cpu"))


def per_system(out, structures):
    ptr = np.concatenate(([0], np.cumsum([len(a) for a in structures])))
    return [{"energy": float(out["energy"][s, 0]), "forces": out["forces"][ptr[s]:ptr[s + 1]].numpy(),
             "charges": out["charges"][ptr[s]:ptr[s + 1]].numpy(),
             **({"stress": out["stress"][s].numpy()} if "stress" in out else {})} for s in range(len(structures))]


@pytest.mark.filterwarnings("ignore:Switching to DSF Coulomb:UserWarning")  # aimnet's own, for the box
def test_a_batch_of_molecules_ions_and_a_box_equals_aimnet2_calculator(aimnet2, model_path, molecules, water_box):
    """Energies, forces and partial charges of every system; the box's stress (DSF Coulomb)."""
    structures = [*molecules, water_box]
    batch = Batch.from_atoms(structures, dtype=torch.float32)
    mine = per_system(aimnet2(batch, compute_stress=False), structures)
    box_stress = aimnet2(Batch.from_atoms([water_box], dtype=torch.float32), compute_stress=True)["stress"][0]
    calc = reference(model_path)
    for s, atoms in enumerate(structures):
        a = atoms.copy()
        a.calc = calc
        assert abs(mine[s]["energy"] - a.get_potential_energy()) < ENERGY_TOL, s
        np.testing.assert_allclose(mine[s]["forces"], a.get_forces(), rtol=0, atol=FORCE_TOL, err_msg=f"system {s}")
        np.testing.assert_allclose(mine[s]["charges"], a.get_charges(), rtol=0, atol=CHARGE_TOL, err_msg=f"system {s}")
    a = water_box.copy()
    a.calc = calc
    np.testing.assert_allclose(box_stress.numpy(), a.get_stress(voigt=False), rtol=0, atol=STRESS_TOL)
    assert float(box_stress.abs().max()) > 10 * STRESS_TOL  # a stress to compare, not zeros


def test_a_system_alone_equals_the_same_system_in_a_batch(aimnet2, molecules, water_box):
    structures = [*molecules, water_box]
    together = per_system(aimnet2(Batch.from_atoms(structures, dtype=torch.float32)), structures)
    for s, atoms in enumerate(structures):
        alone = per_system(aimnet2(Batch.from_atoms([atoms], dtype=torch.float32)), [atoms])[0]
        assert abs(alone["energy"] - together[s]["energy"]) < ENERGY_TOL, s
        np.testing.assert_allclose(alone["forces"], together[s]["forces"], rtol=0, atol=FORCE_TOL)
        np.testing.assert_allclose(alone["charges"], together[s]["charges"], rtol=0, atol=CHARGE_TOL)


def test_changing_the_charge_changes_the_energy_as_aimnet_does(aimnet2, model_path, molecules):
    """Ethanol as anion, neutral and cation: the same energy differences as aimnet's calculator."""
    ethanol = molecules[2]
    forms = []
    for charge in (-1, 0, 1):
        a = ethanol.copy()
        a.info["charge"] = charge
        forms.append(a)
    mine = aimnet2(Batch.from_atoms(forms, dtype=torch.float64))["energy"][:, 0]
    calc = reference(model_path)
    theirs = []
    for a in forms:
        a.calc = calc
        theirs.append(a.get_potential_energy())
    for k in (0, 2):
        change = float(mine[k] - mine[1])
        assert abs(change) > 0.1  # the charge is read, not ignored
        assert change == pytest.approx(theirs[k] - theirs[1], abs=ENERGY_TOL)


def test_float64_positions_give_float64_results_equal_to_float32(aimnet2, molecules):
    """aimnet computes in float32: float64 positions give the same numbers, in float64."""
    out64 = aimnet2(Batch.from_atoms(molecules, dtype=torch.float64))
    out32 = aimnet2(Batch.from_atoms(molecules, dtype=torch.float32))
    assert out64["energy"].dtype == out64["forces"].dtype == out64["charges"].dtype == torch.float64
    torch.testing.assert_close(out64["forces"].float(), out32["forces"], rtol=0, atol=FORCE_TOL)
    torch.testing.assert_close(out64["energy"].float(), out32["energy"], rtol=0, atol=ENERGY_TOL)


def test_the_card_and_the_registry(aimnet2, model_path):
    card = aimnet2.card
    assert card.needs_charge and not card.needs_spin and card.periodic and card.stress and card.cutoff is None
    assert card.species == (1, 6, 7, 8, 9, 16, 17)
    assert not aimnet2.cuda_graphs
    built = registry.build("model:aimnet2", model=model_path)
    assert built.card == card


def test_a_structure_without_a_total_charge_is_refused_naming_the_field(aimnet2, molecules):
    bare = molecules[0].copy()
    bare.info.clear()
    with pytest.raises(InvalidDataError, match=r"total charge \(the system field 'charge'.*atoms.info\['charge'\] = 0"):
        aimnet2(Batch.from_atoms([bare], dtype=torch.float32))


def test_an_element_the_model_lacks_is_refused(aimnet2, molecules):
    batch = Batch.from_atoms(molecules[:2], dtype=torch.float32)
    batch.atomic_numbers[0] = 14  # silicon: not among the random network's elements
    with pytest.raises(InvalidDataError, match=r"no parameters for atomic numbers \[14\]"):
        aimnet2(batch)


def test_stress_of_a_molecule_is_refused(aimnet2, molecules, water_box):
    with pytest.raises(InvalidDataError, match=r"stress was asked of systems \[0\]"):
        aimnet2(Batch.from_atoms([molecules[0], water_box], dtype=torch.float32), compute_stress=True)


def test_bad_arguments_are_configuration_errors(model_path):
    with pytest.raises(ConfigurationError, match="periodic_coulomb must be one of"):
        registry.build("model:aimnet2", model=model_path, periodic_coulomb="wolf")
    with pytest.raises(ConfigurationError, match="neither a file nor a name in aimnet's model registry"):
        registry.build("model:aimnet2", model="aimnet2-nonexistent")


@pytest.mark.parametrize("method", ["ewald", "pme"])
def test_ewald_and_pme_for_periodic_systems_equal_aimnet_with_that_method(model_path, water_box, method):
    from aimnet.calculators import AIMNet2ASE, AIMNet2Calculator
    from alchemi_aimnet import AIMNet2Model

    model = AIMNet2Model(model_path, periodic_coulomb=method)
    out = model(Batch.from_atoms([water_box], dtype=torch.float32))
    calc = AIMNet2Calculator(model_path, device="cpu")
    calc.set_lrcoulomb_method(method)
    a = water_box.copy()
    a.calc = AIMNet2ASE(calc)
    assert float(out["energy"][0, 0]) == pytest.approx(a.get_potential_energy(), abs=ENERGY_TOL)
    np.testing.assert_allclose(out["forces"].numpy(), a.get_forces(), rtol=0, atol=FORCE_TOL)


@pytest.mark.parametrize("inflight", [False, True], ids=["fused", "inflight"])
def test_fire_then_langevin_keep_the_predicted_partial_charges(aimnet2, molecules, water_box, inflight):
    from ase.calculators.singlepoint import SinglePointCalculator

    from alchemi_potentials.testing import relax_then_md

    structures = [*molecules[:3], water_box]
    for a in structures:  # an atom field 'charges' (zeros) for the run to keep the predictions in
        a.calc = SinglePointCalculator(a, charges=np.zeros(len(a)))

    def charges_kept(result):
        predicted = aimnet2(result.clone())["charges"]
        torch.testing.assert_close(result.charges, predicted, rtol=0, atol=1e-4)
        assert float(result.charges.abs().max()) > 1e-2  # predictions, not the zeros the structures came with

    relax_then_md(aimnet2, structures, torch.float32, inflight=inflight, fire_steps=5, md_steps=5,
                  extra_check=charges_kept)


@pytest.mark.parametrize("inflight", [False, True], ids=["fused", "inflight"])
def test_fire_with_a_frechet_cell_filter_then_langevin_on_boxes(aimnet2, water_box, inflight):
    """FIRE moves the cells with the atoms (stress from the model), then Langevin MD, in one stage."""
    from alchemi_core.data import AtomicData
    from alchemi_core.data.datapipes import ListDataset
    from alchemi_core.dynamics import ConvergenceHook, SizeAwareSampler

    boxes = [water_box, water_box.repeat((1, 2, 1))]
    cells = [torch.tensor(np.asarray(b.cell), dtype=torch.float32) for b in boxes]
    sampler = None
    if inflight:  # room for the larger box alone: the smaller one waits for it to finish
        sampler = SizeAwareSampler(ListDataset([AtomicData.from_atoms(b, dtype=torch.float32) for b in boxes]),
                                   max_atoms=len(boxes[1]) + 2, max_batch_size=None, bin_width=1)
    relax = registry.build("integrator:fire", model=aimnet2, n_steps=6, dt=0.2, dt_max=1.0, cell_filter="frechet",
                           convergence_hook=ConvergenceHook.from_fmax(1e-4), sampler=sampler)
    md = registry.build("integrator:langevin", model=aimnet2, n_steps=4, dt=0.5, temperature=300.0, friction=0.01,
                        initial_temperature=300.0, random_seed=0)
    fused = relax + md
    with fused:
        out = fused.run() if inflight else fused.run(Batch.from_atoms(boxes, dtype=torch.float32))
    assert out.num_graphs == 2 and torch.isfinite(out.positions).all() and torch.isfinite(out.forces).all()
    order = out.system_id.view(-1).tolist() if inflight else [0, 1]
    for k, s in enumerate(order):
        assert not torch.allclose(out.cell.reshape(-1, 3, 3)[k], cells[s])  # each cell moved with its atoms



def test_as_an_ase_calculator_it_gives_aimnets_energy_forces_and_charges(aimnet2, model_path, molecules):
    """The charge travels from atoms.info; the partial charges come back as atoms.get_charges()."""
    cation = molecules[1].copy()
    cation.calc = aimnet2.as_ase_calculator(dtype=torch.float32)
    theirs = molecules[1].copy()
    theirs.calc = reference(model_path)
    assert cation.get_potential_energy() == pytest.approx(theirs.get_potential_energy(), abs=ENERGY_TOL)
    np.testing.assert_allclose(cation.get_forces(), theirs.get_forces(), rtol=0, atol=FORCE_TOL)
    np.testing.assert_allclose(cation.get_charges(), theirs.get_charges(), rtol=0, atol=CHARGE_TOL)


def test_a_model_of_a_neutral_only_family_refuses_ions(model_path, molecules, tmp_path):
    """aimnet's rxn family supports no net charge: a charged structure is refused when it enters."""
    from alchemi_aimnet import AIMNet2Model

    artifact = torch.load(model_path, weights_only=True)
    artifact["family"] = "rxn"
    torch.save(artifact, tmp_path / "rxn.pt")
    model = AIMNet2Model(str(tmp_path / "rxn.pt"))
    assert torch.isfinite(model(Batch.from_atoms([molecules[0]], dtype=torch.float32))["energy"]).all()
    with pytest.raises(InvalidDataError, match="trained on neutral systems only"):
        model(Batch.from_atoms(molecules[:2], dtype=torch.float32))


def test_a_spin_polarised_model_reads_the_spin_multiplicity_as_aimnet_does(molecules, tmp_path):
    """An NSE network (two charge channels): spin needed, and singlet against triplet water
    changes the energy as aimnet's calculator says."""
    from alchemi_aimnet import AIMNet2Model
    from alchemi_aimnet.random_model import random_aimnet2_file

    path = random_aimnet2_file(tmp_path / "nse.pt", seed=3, spin_polarised=True)
    model = AIMNet2Model(path)
    assert model.card.needs_spin
    water = molecules[0]
    forms = []
    for spin in (1, 3):
        a = water.copy()
        a.info.update(charge=0, spin=spin)
        forms.append(a)
    mine = model(Batch.from_atoms(forms, dtype=torch.float32))
    calc = reference(path)
    theirs = []
    for k, a in enumerate(forms):
        a.calc = calc
        theirs.append(a.get_potential_energy())
        np.testing.assert_allclose(mine["forces"][3 * k:3 * k + 3].numpy(), a.get_forces(), rtol=0, atol=FORCE_TOL)
    assert float(mine["energy"][0, 0]) == pytest.approx(theirs[0], abs=ENERGY_TOL)
    assert float(mine["energy"][1, 0]) == pytest.approx(theirs[1], abs=ENERGY_TOL)
    assert abs(theirs[1] - theirs[0]) > 1e-3  # the spin is read, not ignored
    bare = water.copy()
    bare.info.pop("spin")
    with pytest.raises(InvalidDataError, match="spin multiplicity 2S"):
        model(Batch.from_atoms([bare], dtype=torch.float32))
