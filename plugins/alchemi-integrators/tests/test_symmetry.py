"""FIRE with FixSymmetry (the system field ``symprec``): a relaxation keeps the space group, and
the trajectory follows ASE's FIRE with ``FixSymmetry`` on the same filter and potential.

Lennard-Jones forces of an exactly symmetric structure are symmetric already, so the potential
here adds fixed per-atom forces and a fixed stress that are not (as an MLIP's numerical noise is
not): only the averaging keeps the group then."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

spglib = pytest.importorskip("spglib")

from ase.build import bulk  # noqa: E402
from ase.calculators.calculator import Calculator, all_changes  # noqa: E402
from ase.constraints import FixSymmetry  # noqa: E402
from ase.filters import FrechetCellFilter, UnitCellFilter  # noqa: E402
from ase.optimize import FIRE as AseFIRE  # noqa: E402
from integrators_testkit.lj_reference import MASS, ReferenceLJ, argon  # noqa: E402

from alchemi_core.data import AtomicData, Batch  # noqa: E402
from alchemi_core.dynamics import ConvergenceHook  # noqa: E402
from alchemi_core.units import ACCELERATION  # noqa: E402
from alchemi_integrators import FIRE  # noqa: E402

FILTERS = {"frechet": FrechetCellFilter, "unit": UnitCellFilter, None: None}


class NoisyLJ(ReferenceLJ):
    """Lennard-Jones plus fixed forces (``[N, 3]``, eV/Å) and a fixed stress (eV/Å³) that break
    every symmetry; one system at a time."""

    def __init__(self, n: int, seed: int = 0, size: float = 2e-3) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)
        self.noise_forces = torch.from_numpy(rng.normal(size=(n, 3)) * size)
        s = rng.normal(size=(3, 3)) * size * 1e-2
        self.noise_stress = torch.from_numpy(s + s.T).unsqueeze(0)

    def forward(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        out = dict(super().forward(batch, compute_stress=compute_stress))
        out["forces"] = out["forces"] + self.noise_forces
        if compute_stress:
            out["stress"] = out["stress"] + self.noise_stress
        return out


class NoisyCalculator(Calculator):
    """:class:`NoisyLJ` as an ASE calculator."""

    implemented_properties = ["energy", "free_energy", "forces", "stress"]

    def __init__(self, model: NoisyLJ) -> None:
        super().__init__()
        self.model = model

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):  # type: ignore[no-untyped-def]
        super().calculate(atoms, properties, system_changes)
        out = self.model(Batch.from_data_list([AtomicData.from_atoms(self.atoms, dtype=torch.float64)]),
                         compute_stress=True)
        stress = out["stress"][0].numpy()
        energy = float(out["energy"][0, 0])
        self.results = {"energy": energy, "free_energy": energy, "forces": out["forces"].numpy().copy(),
                        "stress": stress[[0, 1, 2, 1, 0, 0], [0, 1, 2, 2, 2, 1]].copy()}


def space_group(atoms, symprec: float) -> int:  # type: ignore[no-untyped-def]
    cell = (atoms.cell.array, atoms.get_scaled_positions(), atoms.numbers)
    return int(spglib.get_symmetry_dataset(cell, symprec=symprec).number)


def strained_bcc(fix: bool, seed: int = 0, strain: float = 1.03):  # type: ignore[no-untyped-def]
    """bcc argon (Im-3m, 229; a saddle of Lennard-Jones), strained by 3 % and rattled by 1 mÅ:
    within ``symprec`` of Im-3m, so FixSymmetry finds that group (on a copy: the atoms stay
    rattled, for the engine to refine)."""
    atoms = bulk("Ar", "bcc", a=4.33 * strain, cubic=True)
    atoms.set_masses([MASS] * len(atoms))
    atoms.positions += np.random.default_rng(seed).normal(size=atoms.positions.shape) * 0.001
    if fix:
        atoms.set_constraint(FixSymmetry(atoms.copy(), symprec=0.01))
    return atoms


@pytest.mark.parametrize("fix", [True, False], ids=["FixSymmetry", "free"])
def test_frechet_relaxation_keeps_the_space_group_only_with_fixsymmetry(fix: bool) -> None:
    """With FixSymmetry the relaxed cell is Im-3m to 1e-5 Å (refined at the start, every step
    averaged over the group); without it the rattle the start carries and the forces that break
    the symmetry leave a lower group."""
    atoms = strained_bcc(fix)
    assert space_group(atoms, 0.01) == 229
    batch = Batch.from_atoms([atoms], dtype=torch.float64)
    model = NoisyLJ(len(atoms))
    FIRE(model, n_steps=3000, cell_filter="frechet", convergence_hook=ConvergenceHook.from_fmax(1e-3)).run(batch)
    out = batch.to_atoms()[0]
    assert np.abs(out.cell.array - atoms.cell.array).max() > 0.05, "the cell relaxed"
    assert (space_group(out, 1e-5) == 229) is fix
    if fix:
        assert isinstance(out.constraints[0], FixSymmetry)


def test_systems_that_enter_from_a_sampler_keep_their_group() -> None:
    """Five structures through two slots: each one that enters on a refill is refined and keeps
    Im-3m through its relaxation; the one without FixSymmetry keeps its rattle."""
    from alchemi_core.data.datapipes import ListDataset
    from alchemi_core.dynamics import HostMemory, SizeAwareSampler

    starts = [strained_bcc(i != 2, seed=i, strain=1.0 + 0.01 * i) for i in range(5)]
    assert all(space_group(a, 0.01) == 229 for a in starts)
    data = [AtomicData.from_atoms(a, dtype=torch.float64) for a in starts]
    sink = HostMemory(capacity=10)
    sampler = SizeAwareSampler(ListDataset(data), max_atoms=4, max_batch_size=2, bin_width=1)
    FIRE(ReferenceLJ(), n_steps=3000, cell_filter="frechet", convergence_hook=ConvergenceHook.from_fmax(1e-3),
         sampler=sampler, sinks=[sink]).run()
    out = sink.read()
    assert sorted(out.system_id.tolist()) == list(range(5))
    for row, system in enumerate(out.system_id.tolist()):
        atoms = out.index_select([row]).to_atoms()[0]
        assert (space_group(atoms, 1e-5) == 229) is (system != 2), system


def layered_argon():  # type: ignore[no-untyped-def]
    """Cubic fcc argon, 2x2x2, a layer moved 0.15 Å along z and the cell strained tetragonally:
    P4mm (99), whose atoms have free coordinates (non-zero averaged forces and stress)."""
    atoms = argon(2).to_atoms()
    layer = atoms.get_scaled_positions()[:, 2] < 0.2
    atoms.positions[layer, 2] += 0.15
    atoms.set_cell(atoms.cell.array @ np.diag([1.03, 1.03, 0.98]), scale_atoms=True)
    atoms.set_constraint(FixSymmetry(atoms, symprec=0.01))
    return atoms


@pytest.mark.parametrize("kind", ["frechet", "unit", None])
def test_fire_follows_ase_fire_with_fixsymmetry_step_by_step(kind: str | None) -> None:
    """FIRE (ASE's step cap and time step) with FixSymmetry follows ASE's FIRE on the same filter
    with ``FixSymmetry`` for 40 steps: cell and positions agree within 1e-9 Å. Both sides compute
    the same float64 expressions in another order (ASE averages in fractional coordinates, alchemi
    with Cartesian rotations): rounding of ~1e-15 per step, amplified by FIRE's velocity mixing,
    stays below 1e-10 here; an operation missed or misapplied moves atoms by ~1e-2 Å."""
    atoms = layered_argon()
    assert space_group(atoms, 1e-5) == 99
    to_ase = math.sqrt(ACCELERATION / MASS)
    steps = 40
    batch = Batch.from_atoms([atoms], dtype=torch.float64)
    model = NoisyLJ(len(atoms))
    FIRE(model, n_steps=steps, dt=0.1 / to_ase, dt_max=1.0 / to_ase, maxstep=0.2, maxstep_scope="system",
         cell_filter=kind).run(batch)
    ref = atoms.copy()
    ref.set_constraint(FixSymmetry(ref, symprec=0.01))
    ref.calc = NoisyCalculator(model)
    opt = AseFIRE(FILTERS[kind](ref) if kind else ref, logfile=None)
    for _ in range(steps):
        opt.step()
    assert np.abs(ref.positions - atoms.positions).max() > 0.02, "the atoms moved"
    np.testing.assert_allclose(batch.cell[0].numpy(), ref.cell.array, rtol=0, atol=1e-9)
    np.testing.assert_allclose(batch.positions.numpy(), ref.positions, rtol=0, atol=1e-9)
    assert space_group(batch.to_atoms()[0], 1e-5) == space_group(ref, 1e-5)


def test_a_system_without_symmetry_relaxes_as_it_would_alone() -> None:
    """In a batch with a symmetric system, a system without ``symprec`` takes the same steps bit
    for bit as in a batch of its own."""
    plain = argon(2, rattle=0.05, seed=1).to_atoms()
    runs = []
    for starts in ([plain], [layered_argon(), plain]):
        batch = Batch.from_atoms(starts, dtype=torch.float64)
        FIRE(ReferenceLJ(), n_steps=15, cell_filter="frechet").run(batch)
        runs.append(batch)
    alone, mixed = runs
    assert torch.equal(mixed.positions[-len(plain):], alone.positions)
    assert torch.equal(mixed.cell[-1], alone.cell[0])


class PulledSprings:
    """Atoms on springs to homes 0.05 Å off their symmetric start, and a fixed stress: forces and
    stress that break the symmetry, from torch alone (a model that never reads back)."""

    def __init__(self, batch: Batch) -> None:
        rng = np.random.default_rng(4)
        self.home = batch.positions + torch.from_numpy(rng.normal(size=tuple(batch.positions.shape)) * 0.05).to(
            batch.positions)
        s = rng.normal(size=(3, 3)) * 1e-4
        self.stress = torch.from_numpy(s + s.T).to(batch.positions).expand(batch.num_graphs, 3, 3).contiguous()

    def __call__(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        d = batch.positions - self.home
        forces = torch.mul(d, -0.5, out=batch.forces)
        energy = batch.energy.zero_().index_add_(0, batch.batch_idx, (d * d).sum(-1, keepdim=True) * 0.25)
        return {"energy": energy, "forces": forces, "stress": self.stress}


def symmetric_fire(device: str, compiled: bool, steps: int = 30) -> Batch:
    """``steps`` of FIRE with the Frechet filter on the layered argon cell, on ``device``."""
    batch = Batch.from_atoms([layered_argon()], dtype=torch.float64).to(device)
    stage = FIRE(PulledSprings(batch), n_steps=steps, dt=1.0, cell_filter="frechet")
    (stage.compile() if compiled else stage).run(batch)
    return batch


def test_symmetric_steps_with_a_torch_model() -> None:
    """The model of the GPU test below, on the CPU: the cell and atoms move and keep P4mm."""
    batch = symmetric_fire("cpu", compiled=False)
    out = batch.to_atoms()[0]
    assert np.abs(out.cell.array - layered_argon().cell.array).max() > 1e-3
    assert space_group(out, 1e-5) == 99


@pytest.mark.gpu
def test_fixsymmetry_on_gpu_without_host_syncs_and_in_a_captured_step() -> None:
    """On the GPU: steps with FixSymmetry never synchronise with the host, and a step captured as
    a CUDA graph follows the CPU's eager steps (float64, to rounding)."""
    from alchemi_core.testing.gpu import no_host_sync

    batch = Batch.from_atoms([layered_argon()], dtype=torch.float64).to("cuda")
    dynamics = FIRE(PulledSprings(batch), n_steps=30, dt=1.0, cell_filter="frechet")
    dynamics.step(batch)  # the first step prepares the run (allowed to read back)
    dynamics.step(batch)
    with no_host_sync():
        for _ in range(5):
            dynamics.step(batch)
    cpu = symmetric_fire("cpu", compiled=False)
    gpu = symmetric_fire("cuda", compiled=True)
    torch.testing.assert_close(gpu.cell.cpu(), cpu.cell, rtol=0, atol=1e-10)
    torch.testing.assert_close(gpu.positions.cpu(), cpu.positions, rtol=0, atol=1e-10)
    assert space_group(gpu.to("cpu").to_atoms()[0], 1e-5) == 99
