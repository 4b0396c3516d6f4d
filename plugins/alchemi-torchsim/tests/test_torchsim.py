"""model:torchsim against the same TorchSim models called through TorchSim (states built by
TorchSim's own ``atoms_to_state``), its errors, and a fused FIRE + Langevin run with a sampler
and a Zarr sink whose stored energies TorchSim reproduces."""

from __future__ import annotations

import pytest
import torch
import torch_sim as ts
from ase.build import bulk, fcc111, molecule
from ase.cluster import Icosahedron

from alchemi_core import registry
from alchemi_core.data import AtomicData, Batch
from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import ConvergenceHook, FusedStage, SizeAwareSampler
from alchemi_core.errors import ConfigurationError
from alchemi_integrators import FIRE, Langevin
from alchemi_torchsim import TorchSimModel
from alchemi_torchsim.testing import ARGON, lennard_jones, mace_torchsim
from alchemi_zarr import ZarrData

CPU = torch.device("cpu")


def argon_systems():
    """Crystals of two sizes, a slab with vacuum (periodic in x and y), a free cluster (with a
    cell, smaller than the cutoff, that only its stress is taken over) and the same cluster in a
    periodic box: three periodicities in one batch, rattled."""
    crystals = [bulk("Ar", "fcc", a=5.26, cubic=True).repeat(r) for r in [(2, 2, 2), (1, 1, 2)]]
    slab = fcc111("Ar", (2, 2, 3), a=5.26, vacuum=6.0)
    slab.pbc = (True, True, False)
    cluster = Icosahedron("Ar", 2, latticeconstant=5.26)
    boxed = cluster.copy()
    cluster.center(vacuum=2.0)
    boxed.center(vacuum=10.0)
    boxed.pbc = True
    systems = [*crystals, slab, cluster, boxed]
    for seed, atoms in enumerate(systems):
        atoms.rattle(0.1, seed=seed)
    return systems


def copper_systems():
    """Copper crystals of two sizes, a copper slab with vacuum and a water molecule in a box."""
    crystals = [bulk("Cu", "fcc", a=3.61, cubic=True).repeat(r) for r in [(1, 1, 1), (2, 1, 1)]]
    slab = fcc111("Cu", (2, 2, 2), a=3.61, vacuum=5.0)
    water = molecule("H2O")
    water.center(vacuum=4.0)
    water.pbc = True
    systems = [*crystals, slab, water]
    for seed, atoms in enumerate(systems):
        atoms.rattle(0.05, seed=seed)
    return systems


def through_torchsim(ts_model, atoms) -> dict[str, torch.Tensor]:
    """``ts_model`` on one structure, its state built by TorchSim from the ASE atoms."""
    return ts_model(ts.io.atoms_to_state([atoms], device=CPU, dtype=ts_model.dtype))


@pytest.mark.parametrize(("make", "systems"), [(lennard_jones, argon_systems), (mace_torchsim, copper_systems)],
                         ids=["lennard-jones", "mace"])
def test_a_mixed_batch_equals_each_system_through_torchsim(make, systems):
    ts_model = make()
    structures = systems()
    batch = Batch.from_atoms(structures, dtype=torch.float64)
    out = TorchSimModel(ts_model)(batch, compute_stress=True)
    offset = 0
    for k, atoms in enumerate(structures):
        ref = through_torchsim(ts_model, atoms)
        n = len(atoms)
        torch.testing.assert_close(out["energy"][k], ref["energy"], rtol=0, atol=1e-10)
        torch.testing.assert_close(out["forces"][offset : offset + n], ref["forces"], rtol=0, atol=1e-10)
        torch.testing.assert_close(out["stress"][k], ref["stress"][0], rtol=0, atol=1e-12)
        offset += n


def test_float32_positions_run_the_float64_model_and_come_back_in_float32():
    structures = argon_systems()[:2]
    out = TorchSimModel(lennard_jones())(Batch.from_atoms(structures, dtype=torch.float32), compute_stress=True)
    assert {v.dtype for v in out.values()} == {torch.float32}
    ref = through_torchsim(lennard_jones(), structures[1])
    torch.testing.assert_close(out["energy"][1], ref["energy"].float(), rtol=1e-5, atol=1e-6)


def test_a_class_named_by_import_path_builds_like_the_object():
    by_path = registry.build("model:torchsim", model="torch_sim.models.lennard_jones:LennardJonesModel",
                             model_kwargs={**ARGON, "compute_stress": True}, trust_import=True)
    assert by_path.card.name == "torchsim:LennardJonesModel" and by_path.card.stress
    assert by_path.card.cutoff == pytest.approx(ARGON["cutoff"])
    batch = Batch.from_atoms(argon_systems(), dtype=torch.float64)
    torch.testing.assert_close(by_path(batch)["energy"], TorchSimModel(lennard_jones())(batch)["energy"])


def test_what_is_no_usable_torchsim_model_is_refused_saying_why():
    with pytest.raises(ConfigurationError, match="expected a TorchSim model.*got Linear"):
        TorchSimModel(torch.nn.Linear(3, 1))
    lj = "torch_sim.models.lennard_jones:LennardJonesModel"
    with pytest.raises(ConfigurationError, match="compute_forces=False.*build it with compute_forces=True"):
        TorchSimModel(lj, model_kwargs={"compute_forces": False}, trust_import=True)
    with pytest.raises(ConfigurationError, match="'package.module:Class'"):
        TorchSimModel("LennardJonesModel", trust_import=True)
    with pytest.raises(ConfigurationError, match="cannot import 'torch_sim.models.nothing:X'"):
        TorchSimModel("torch_sim.models.nothing:X", trust_import=True)


def test_an_import_path_needs_trust_and_must_name_a_torchsim_model_class(monkeypatch):
    """A workflow file runs no code unasked: nothing is imported without trust_import=True, and
    what is imported is called only if it is a TorchSim model class."""
    import sys

    monkeypatch.delitem(sys.modules, "torch_sim.models.soft_sphere", raising=False)
    with pytest.raises(ConfigurationError, match="imports 'torch_sim.models.soft_sphere'.*trust_import=True"):
        TorchSimModel("torch_sim.models.soft_sphere:SoftSphereModel")
    assert "torch_sim.models.soft_sphere" not in sys.modules
    with pytest.raises(ConfigurationError, match="'subprocess:run' is not a TorchSim model class"):
        TorchSimModel("subprocess:run", model_kwargs={"args": ["false"]}, trust_import=True)
    with pytest.raises(ConfigurationError, match="model_kwargs go with an import path"):
        TorchSimModel(lennard_jones(), model_kwargs={"sigma": 1.0})


def test_systems_entering_rebuild_the_state_and_steps_reuse_it():
    model = TorchSimModel(lennard_jones())
    batch = Batch.from_atoms(argon_systems(), dtype=torch.float64)
    model(batch)
    state = model._groups[0].state
    batch.positions.add_(0.01)  # a step moves atoms: same systems, same state
    moved = model(batch)["energy"]
    assert model._groups[0].state is state
    torch.testing.assert_close(moved, TorchSimModel(lennard_jones())(batch.clone())["energy"], rtol=0, atol=0)
    kept = batch.index_select(torch.tensor([0, 3]))  # another set of systems: a new state
    model(kept)
    assert model._groups[0].state is not state and len(model._groups) == 2


@pytest.mark.parametrize(("make", "systems", "relax_steps", "max_atoms"),
                         [(lennard_jones, argon_systems, 300, 80), (mace_torchsim, copper_systems, 20, 20)],
                         ids=["lennard-jones", "mace"])
def test_fire_then_langevin_fused_with_a_sampler_and_a_zarr_sink(tmp_path, make, systems, relax_steps, max_atoms):
    """Periodic systems, each twice, through a batch that refills as they graduate."""
    structures = [AtomicData.from_atoms(a, dtype=torch.float64) for a in systems() if a.pbc.all()] * 2
    sampler = SizeAwareSampler(ListDataset(structures), max_atoms=max_atoms, max_batch_size=3, bin_width=1)
    ts_model = make()
    model = TorchSimModel(ts_model)
    relax = FIRE(model, n_steps=relax_steps, dt=5.0, sampler=sampler, refill_frequency=5,
                 convergence_hook=ConvergenceHook.from_fmax(0.02))
    md = Langevin(model, n_steps=20, dt=2.0, temperature=40.0, friction=0.02, initial_temperature=40.0,
                  random_seed=1)
    sink = ZarrData(str(tmp_path / "out.zarr"))
    FusedStage([(0, relax), (1, md)], sinks=[sink]).run()
    out = sink.read()
    assert sorted(out.system_id.tolist()) == list(range(len(structures)))
    assert out.status.tolist() == [2] * len(structures)  # relaxed, then their MD steps
    for k, atoms in enumerate(out.to_atoms()):
        ref = through_torchsim(ts_model, atoms)
        torch.testing.assert_close(out.energy[k].view(()), ref["energy"][0], rtol=0, atol=1e-9)
        start = through_torchsim(ts_model, structures[int(out.system_id[k])].to_atoms())
        assert float(ref["energy"][0]) < float(start["energy"][0])  # relaxed below its rattled start


def test_alchemi_run_of_a_workflow_file_naming_the_model_class(tmp_path):
    from alchemi_core.testing.workflow_run import run_workflow_cli
    from alchemi_zarr import AtomicDataZarrReader

    kwargs = ", ".join(f"{k} = {v}" for k, v in ARGON.items())
    model = ('component = "model:torchsim"\nmodel = "torch_sim.models.lennard_jones:LennardJonesModel"\n'
             f"model_kwargs = {{ {kwargs} }}\ntrust_import = true")
    summary, store = run_workflow_cli(tmp_path, model, dtype="float64")
    assert summary["structures_in"] == summary["structures_out"] == 2 and summary["every_structure_once"]
    batch = AtomicDataZarrReader(store).read_batch()
    assert batch.status.tolist() == [2, 2]
    for k, atoms in enumerate(batch.to_atoms()):
        ref = through_torchsim(lennard_jones(), atoms)
        torch.testing.assert_close(batch.energy[k].view(()), ref["energy"][0], rtol=0, atol=1e-9)


def test_a_sampler_plans_its_batches_from_the_memory_per_atom_given():
    from alchemi_core.errors import InvalidDataError

    structures = [AtomicData.from_atoms(argon_systems()[0], dtype=torch.float64)]
    assert TorchSimModel(lennard_jones()).bytes_per_atom() == 8192  # the sampler's generic estimate
    model = TorchSimModel(lennard_jones(), memory_per_atom=1e13)  # 10 TB an atom: no batch fits
    assert model.bytes_per_atom() == 1e13
    with pytest.raises(InvalidDataError, match=r"32 atoms.*'torchsim:LennardJonesModel' needs about 10000.0 GB"):
        FIRE(model, n_steps=2, sampler=SizeAwareSampler(ListDataset(structures), max_atoms=None)).run()
