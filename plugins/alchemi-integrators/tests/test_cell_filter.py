"""Cell filters against ASE's FrechetCellFilter and UnitCellFilter: matrix functions, forces,
FIRE trajectories step by step, and relaxed lattice constants."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch
from ase.constraints import FixAtoms, FixCartesian
from ase.filters import FrechetCellFilter, UnitCellFilter
from ase.optimize import FIRE as AseFIRE
from integrators_testkit.lj_reference import MASS, ReferenceLJ, argon, ase_lj_calculator, fast_ase_calculator
from integrators_testkit.oracles import oracle, phi1

from alchemi_core.data import Batch
from alchemi_core.dynamics import ConvergenceHook
from alchemi_core.errors import ConfigurationError
from alchemi_core.units import ACCELERATION
from alchemi_integrators import FIRE, FIRE2
from alchemi_integrators.cell_filter import CELL_DOF, CELL_FILTER_FMAX, CELL_REFERENCE, CellFilter
from alchemi_integrators.cell_math import expm, expm_frechet_adjoint, logm_near_identity

FILTERS = {"frechet": FrechetCellFilter, "unit": UnitCellFilter}


def test_matrix_functions_match_scipy() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(4, 3, 3)) * 0.3
    g = rng.normal(size=(4, 3, 3))
    at = torch.from_numpy(a)
    for k in range(4):
        np.testing.assert_allclose(expm(at)[k].numpy(), scipy.linalg.expm(a[k]), rtol=0, atol=1e-13)
        f = scipy.linalg.expm(a[k])
        np.testing.assert_allclose(logm_near_identity(torch.from_numpy(f)[None])[0].numpy(), a[k], atol=1e-12)
        # The adjoint of the Frechet derivative: <G, D exp(A)[E_ij]> for every direction E_ij.
        want = np.array([[np.sum(scipy.linalg.expm_frechet(a[k], np.eye(3)[[i]].T @ np.eye(3)[[j]],
                                                           compute_expm=False) * g[k])
                          for j in range(3)] for i in range(3)])
        got = expm_frechet_adjoint(at[k : k + 1], torch.from_numpy(g[k : k + 1]))[0].numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    small = at * 0.01
    exact = (expm(small) - torch.eye(3, dtype=torch.float64)) @ torch.linalg.inv(small)
    np.testing.assert_allclose(phi1(small).numpy(), exact.numpy(), atol=1e-12)


def _deformed_start(kind: str, seed: int, mask=None, **options):  # type: ignore[no-untyped-def]
    """An ASE filter on a rattled argon cell, deformed through the filter's own degrees of freedom,
    and the same state as a batch with the filter's fields."""
    rng = np.random.default_rng(seed)
    atoms = argon(2, rattle=0.1, seed=seed).to_atoms()
    atoms.calc = ase_lj_calculator()
    filt = FILTERS[kind](atoms, mask=mask, **options)
    pos = filt.get_positions()
    n = len(atoms)
    pos[n:] += rng.normal(size=(3, 3)) * 0.03 * n  # a general (non-symmetric) deformation
    filt.set_positions(pos)
    data = argon(2)
    data.positions = torch.from_numpy(atoms.positions.copy())
    data.cell = torch.from_numpy(atoms.cell.array.copy()).unsqueeze(0)
    batch = Batch.from_data_list([data])
    return filt, atoms, batch


@pytest.mark.parametrize("kind", ["frechet", "unit"])
@pytest.mark.parametrize(
    "options",
    [{}, {"scalar_pressure": 0.002}, {"hydrostatic_strain": True}, {"constant_volume": True},
     {"mask": [True, True, False, True, False, False]}],
    ids=["plain", "pressure", "hydrostatic", "constant-volume", "mask"],
)
def test_forces_match_ase(kind: str, options: dict) -> None:
    """Atom and cell forces equal the ASE filter's ``get_forces`` for a deformed, rattled cell."""
    filt, atoms, batch = _deformed_start(kind, 3, **options)
    ours = CellFilter(kind, **{k: v for k, v in options.items() if k != "scalar_pressure"})
    n = len(atoms)
    for name in (CELL_REFERENCE, CELL_DOF):
        batch.set_field(name, torch.zeros(1, 3, 3, dtype=torch.float64), "system")
    getattr(batch, CELL_REFERENCE).copy_(torch.from_numpy(np.array(filt.orig_cell)).unsqueeze(0))
    getattr(batch, CELL_DOF).copy_(ours.dof_of_deformation(batch, ours.deformation(batch)))
    batch.forces = torch.from_numpy(atoms.get_forces())
    batch.set_field("stress", torch.from_numpy(atoms.get_stress(voigt=False)).unsqueeze(0), "system")
    pressure = torch.tensor([options.get("scalar_pressure", 0.0)], dtype=torch.float64)
    atom_f, cell_f = ours.forces(batch, pressure, torch.empty(n, 3, dtype=torch.float64))
    want = filt.get_forces()
    assert np.abs(want[n:]).max() > 1e-3, "the cell has forces to compare"
    np.testing.assert_allclose(atom_f.numpy(), want[:n], rtol=0, atol=1e-12)
    np.testing.assert_allclose(cell_f[0].numpy(), want[n:], rtol=0, atol=1e-11)
    # The degrees of freedom are ASE's too (whose Frechet ones are N log(N F): offset by N log N).
    offset = n * math.log(n) * np.eye(3) if kind == "frechet" else 0.0
    np.testing.assert_allclose(getattr(batch, CELL_DOF)[0].numpy(), filt.get_positions()[n:] - offset, atol=1e-10)


#: Constraints ASE's filters honour through ``Atoms.set_positions``: atoms held whole (a slab's
#: bottom layer) and single Cartesian components; both move with the cell only.
CONSTRAINTS = {
    "none": lambda: [],
    "FixAtoms+FixCartesian": lambda: [FixAtoms([0, 17]), FixCartesian([3, 9], mask=(True, False, True)),
                             FixCartesian([20], mask=(False, True, False))],
}


@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
@pytest.mark.parametrize("kind", ["frechet", "unit"])
def test_fire_follows_ase_fire_with_the_filter_step_by_step(kind: str, constraint: str) -> None:
    """FIRE with a cell filter follows ASE's FIRE on the ASE filter (ASE's step cap, its massless
    time step converted to fs): cell and positions agree to rounding after 25 steps, with fixed
    atoms and components too (which follow the cell's deformation, as in ASE). So does the torch
    oracle, which the production step (Warp, over the filter's rows) matches to rounding."""
    to_ase = math.sqrt(ACCELERATION / MASS)
    starts = []
    for s in range(2):
        atoms = argon(2, rattle=0.1, seed=s).to_atoms()
        atoms.set_cell(atoms.cell * (1.04 if s == 0 else 0.96), scale_atoms=True)
        atoms.set_constraint(CONSTRAINTS[constraint]())
        starts.append(atoms)
    steps = 25
    runs = []
    for cls in (FIRE, oracle(FIRE)):
        batch = Batch.from_atoms(starts, dtype=torch.float64)
        cls(ReferenceLJ(), n_steps=steps, dt=0.1 / to_ase, dt_max=1.0 / to_ase, maxstep=0.2, maxstep_scope="system",
            cell_filter=kind).run(batch)
        runs.append(batch)
    production, torch_oracle = runs
    torch.testing.assert_close(production.cell, torch_oracle.cell, rtol=0, atol=1e-12)
    torch.testing.assert_close(production.positions, torch_oracle.positions, rtol=0, atol=1e-11)
    for s, atoms in enumerate(starts):
        atoms.calc = fast_ase_calculator()
        opt = AseFIRE(FILTERS[kind](atoms), logfile=None)
        for _ in range(steps):
            opt.step()
        for batch in runs:
            np.testing.assert_allclose(batch.cell[s].numpy(), atoms.cell.array, rtol=0, atol=1e-9)
            np.testing.assert_allclose(batch.positions[32 * s : 32 * (s + 1)].numpy(), atoms.positions, atol=1e-9)


#: At 0.05 eV/Å a cell stops ~0.1 Å short of its minimum (the cell force is ~ V/N times the stress);
#: at 1e-5 eV/Å both optimisers end within ~2e-5 Å of it, so 1e-4 Å tests the minimum each reaches.
LATTICE_FMAX = 1e-5
STRAINS = (0.95, 1.05)


def _strained_starts() -> list:
    starts = []
    for s, strain in enumerate(STRAINS):
        d = argon(2, rattle=0.1, seed=10 + s)
        d.cell, d.positions = d.cell * strain, d.positions * strain
        starts.append(d)
    return starts


@pytest.fixture(scope="module")
def ase_lattices() -> list[float]:
    """The lattice constant ASE's FIRE on a FrechetCellFilter relaxes each start to (SciPy's
    Fréchet derivative makes each ASE step cost ~0.1 s here: computed once for the module)."""
    out = []
    for d in _strained_starts():
        atoms = d.to_atoms()
        atoms.calc = fast_ase_calculator()  # ASE's LJ, evaluated faster (checked against it below)
        AseFIRE(FrechetCellFilter(atoms), logfile=None).run(fmax=LATTICE_FMAX, steps=5000)
        out.append(float(abs(np.linalg.det(atoms.cell.array)) ** (1 / 3) / 2))
    return out


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("cls", [FIRE, FIRE2])
def test_strained_cells_relax_to_ase_lattice_constant(cls: type, ase_lattices: list[float]) -> None:
    """Argon cells strained by -5 % and +5 % and rattled relax, each under its own convergence
    (fmax over atoms and cell rows), to the lattice constant ASE's FIRE on a FrechetCellFilter
    reaches from the same start, within 1e-4 Å."""
    batch = Batch.from_data_list(_strained_starts())
    relax = cls(ReferenceLJ(), n_steps=3000, dt=5.0, dt_max=50.0, cell_filter="frechet",
                convergence_hook=ConvergenceHook.from_fmax(LATTICE_FMAX))
    relax.run(batch)
    assert batch.status.tolist() == [1, 1]
    assert getattr(batch, CELL_FILTER_FMAX).max().item() <= LATTICE_FMAX
    lattice = torch.linalg.det(batch.cell).abs() ** (1 / 3) / 2
    for s, want in enumerate(ase_lattices):
        assert lattice[s].item() == pytest.approx(want, abs=1e-4)
    assert abs(lattice.mean().item() - 5.26) > 0.01  # moved to LJ's own minimum, not back to the start


def test_fast_calculator_is_ases_lj() -> None:
    atoms = argon(2, rattle=0.1, seed=4).to_atoms()
    atoms.set_cell(atoms.cell.array @ np.array([[1.03, 0.02, 0.0], [0.0, 0.97, 0.01], [0.0, 0.0, 1.0]]),
                   scale_atoms=True)
    ours, ase = atoms.copy(), atoms.copy()
    ours.calc, ase.calc = fast_ase_calculator(), ase_lj_calculator()
    np.testing.assert_allclose(ours.get_forces(), ase.get_forces(), atol=1e-12)
    np.testing.assert_allclose(ours.get_stress(), ase.get_stress(), atol=1e-14)
    assert ours.get_potential_energy() == pytest.approx(ase.get_potential_energy(), abs=1e-10)


def test_options_without_a_filter_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="cell filter"):
        FIRE(ReferenceLJ(), hydrostatic_strain=True)
    with pytest.raises(ConfigurationError, match="cell_filter must be one of"):
        FIRE(ReferenceLJ(), cell_filter="exp")
