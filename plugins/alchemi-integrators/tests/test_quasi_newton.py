"""L-BFGS and BFGS against ASE's ``LBFGS`` and ``BFGS`` on the same Lennard-Jones potential in float64:
step by step (with and without cell filters, with held atoms and components), to the same minima
in no more steps, batches of mixed sizes equal to each system alone, and inflight refills."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from ase.build import fcc111
from ase.constraints import FixAtoms, FixCartesian
from ase.filters import FrechetCellFilter, UnitCellFilter
from ase.optimize import BFGS as AseBFGS
from ase.optimize import LBFGS as AseLBFGS
from integrators_testkit.lj_reference import ReferenceLJ, argon, fast_ase_calculator

from alchemi_core.data import AtomicData, Batch
from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import ConvergenceHook, HostMemory, SizeAwareSampler
from alchemi_core.errors import ConfigurationError
from alchemi_integrators import BFGS, LBFGS
from alchemi_integrators.quasi_newton import LBFGS_STAMP, QN_STEPS

ASE = {LBFGS: AseLBFGS, BFGS: AseBFGS}
FILTERS = {"frechet": FrechetCellFilter, "unit": UnitCellFilter}
CONSTRAINTS = {
    "none": lambda: [],
    "FixAtoms+FixCartesian": lambda: [FixAtoms([0, 17]), FixCartesian([3, 9], mask=(True, False, True)),
                                      FixCartesian([20], mask=(False, True, False))],
}


def _crystal(seed: int, strain: float = 1.0, rattle: float = 0.1, repeat: int = 2) -> Any:
    atoms = argon(repeat, rattle=rattle, seed=seed).to_atoms()
    atoms.set_cell(atoms.cell * strain, scale_atoms=True)
    return atoms


def _slab(seed: int) -> Any:
    """A rattled three-layer argon (111) slab whose bottom layer is held (``FixAtoms``)."""
    slab = fcc111("Ar", size=(2, 2, 3), a=5.26, vacuum=6.0)
    slab.rattle(stdev=0.1, seed=seed)
    slab.set_constraint(FixAtoms(mask=slab.get_tags() == 3))
    return slab


def _batch(starts: list) -> Batch:
    return Batch.from_atoms(starts, dtype=torch.float64)


def _ase(cls: type, atoms: Any, cell_filter: str | None, steps: int = 0, fmax: float | None = None,
         **kwargs: Any) -> tuple[Any, int]:
    """ASE's optimiser from the same start (a copy): the relaxed atoms and its step count."""
    atoms = atoms.copy()
    atoms.calc = fast_ase_calculator()  # ASE's LJ (test_cell_filter checks it), evaluated faster
    target = atoms if cell_filter is None else FILTERS[cell_filter](atoms)
    opt = ASE[cls](target, logfile=None, **kwargs)
    if fmax is None:
        for _ in range(steps):
            opt.step()
    else:
        assert opt.run(fmax=fmax, steps=1000)
    return atoms, opt.nsteps


def _rows(batch: Batch, s: int) -> slice:
    ptr = batch.batch_ptr.tolist()
    return slice(ptr[s], ptr[s + 1])


@pytest.mark.parametrize(("cell_filter", "constraint"), [(None, "none"), (None, "FixAtoms+FixCartesian"),
                                                         ("frechet", "FixAtoms+FixCartesian"), ("unit", "none")])
@pytest.mark.parametrize("cls", [LBFGS, BFGS])
def test_follows_ase_step_by_step(cls: type, cell_filter: str | None, constraint: str) -> None:
    """A compressed and a stretched rattled cell in one batch: after 15 steps every position (and
    cell) equals ASE's to rounding, held atoms and components included (SciPy's and our matrix
    exponential and logarithm differ by ~1e-10 Å over 15 Fréchet steps)."""
    starts = [_crystal(0, 1.03), _crystal(1, 0.97)]
    for atoms in starts:
        atoms.set_constraint(CONSTRAINTS[constraint]())
    batch = _batch(starts)
    steps = 15
    cls(ReferenceLJ(), n_steps=steps, cell_filter=cell_filter).run(batch)
    assert batch.positions.sub(_batch(starts).positions).abs().max() > 0.05  # it moved
    for s, start in enumerate(starts):
        atoms, _ = _ase(cls, start, cell_filter, steps=steps)
        np.testing.assert_allclose(batch.positions[_rows(batch, s)].numpy(), atoms.positions, rtol=0, atol=1e-8)
        np.testing.assert_allclose(batch.cell[s].numpy(), atoms.cell.array, rtol=0, atol=1e-8)


def test_a_short_memory_keeps_the_last_pairs_as_ase() -> None:
    """``memory=3`` over 20 steps: the ring of pairs drops the oldest as ASE's lists do."""
    start = _crystal(2, 1.02)
    batch = _batch([start])
    LBFGS(ReferenceLJ(), n_steps=20, memory=3, alpha=30.0).run(batch)
    atoms, _ = _ase(LBFGS, start, None, steps=20, memory=3, alpha=30.0)
    np.testing.assert_allclose(batch.positions.numpy(), atoms.positions, rtol=0, atol=1e-10)
    assert sorted(getattr(batch, LBFGS_STAMP)[0].tolist()) == [17, 18, 19]  # the last three pairs


#: Both stop where the largest force (with a filter: of atoms and cell rows) drops below FMAX; at
#: 1e-3 eV/Å what is left above an argon minimum is < 1e-5 eV per atom.
FMAX = 1e-3


def _starts() -> list:
    """Rattled and strained (+-3 %) fcc crystals and a slab with held atoms (sizes 32, 32, 32, 12)."""
    return [_crystal(3), _crystal(4, 1.03, rattle=0.05), _crystal(5, 0.97, rattle=0.05), _slab(6)]


# ASE's Fréchet filter spends ~0.1 s per step in SciPy (minutes with a multithreaded BLAS on a busy machine).
@pytest.mark.parametrize("cell_filter", [None, pytest.param("frechet", marks=pytest.mark.slow)])
@pytest.mark.parametrize("cls", [LBFGS, BFGS])
def test_reaches_ases_minima_in_no_more_steps(cls: type, cell_filter: str | None) -> None:
    """Every system, each under its own convergence, reaches ASE's minimum energy within 1e-4 eV
    per atom in at most ASE's steps + 10 %."""
    starts = _starts()
    batch = _batch(starts)
    cls(ReferenceLJ(), n_steps=1000, cell_filter=cell_filter,
        convergence_hook=ConvergenceHook.from_fmax(FMAX)).run(batch)
    assert batch.status.tolist() == [1] * len(starts), "every system converged"
    steps = getattr(batch, QN_STEPS).tolist()
    assert len(set(steps)) > 1  # each stopped on its own
    for s, start in enumerate(starts):
        atoms, ase_steps = _ase(cls, start, cell_filter, fmax=FMAX)
        per_atom = abs(batch.energy[s].item() - atoms.get_potential_energy()) / len(atoms)
        assert per_atom <= 1e-4, (s, per_atom)
        assert steps[s] <= math.ceil(1.1 * ase_steps), (s, steps[s], ase_steps)


@pytest.mark.parametrize("cell_filter", [None, "frechet"])
@pytest.mark.parametrize("cls", [LBFGS, BFGS])
def test_systems_of_different_sizes_together_equal_each_alone(cls: type, cell_filter: str | None) -> None:
    """4-, 32- and 12-atom systems in one batch follow their runs alone (BFGS pads the smaller
    ones' Hessians; L-BFGS's sums run over each system's own atoms)."""
    starts = [_crystal(7, 1.02, repeat=1), _crystal(8, 0.98), _slab(9)]
    together = _batch(starts)
    cls(ReferenceLJ(), n_steps=12, cell_filter=cell_filter).run(together)
    for s, start in enumerate(starts):
        alone = _batch([start])
        cls(ReferenceLJ(), n_steps=12, cell_filter=cell_filter).run(alone)
        torch.testing.assert_close(together.positions[_rows(together, s)], alone.positions, rtol=0, atol=1e-10)
        torch.testing.assert_close(together.cell[s], alone.cell[0], rtol=0, atol=1e-10)


def _data(atoms: Any) -> AtomicData:
    return AtomicData.from_atoms(atoms, dtype=torch.float64)


@pytest.mark.parametrize("cls", [LBFGS, BFGS])
def test_refilled_slots_start_a_fresh_history(cls: type) -> None:
    """Five structures through two slots: each system that enters a slot another left relaxes
    exactly as it does alone (a history carried over from the slot's last system would change it)."""
    starts = [_crystal(10, 1.02, repeat=1), _crystal(11, 0.98), _slab(12), _crystal(13, repeat=1), _crystal(14)]
    data = [_data(a) for a in starts]
    sink = HostMemory()
    sampler = SizeAwareSampler(ListDataset(data), max_atoms=64, max_batch_size=2, bin_width=1)
    extra = {"max_atoms": 32} if cls is BFGS else {}
    cls(ReferenceLJ(), n_steps=300, sampler=sampler, sinks=[sink], convergence_hook=ConvergenceHook.from_fmax(1e-2),
        **extra).run()
    out = sink.read()
    assert sorted(out.system_id.tolist()) == list(range(len(starts)))
    for row, system in enumerate(out.system_id.tolist()):
        alone = _batch([starts[system]])
        cls(ReferenceLJ(), n_steps=300, convergence_hook=ConvergenceHook.from_fmax(1e-2)).run(alone)
        assert alone.status.tolist() == [1]
        torch.testing.assert_close(out.positions[_rows(out, row)], alone.positions, rtol=0, atol=1e-10)


@pytest.mark.parametrize("cls", [LBFGS, BFGS])
def test_a_second_stage_of_the_same_kind_starts_afresh(cls: type) -> None:
    """Two stages of one optimiser fused (their state in the same fields): systems take their 6
    steps in the first, then start a fresh history in the second, while the first keeps stepping
    the others; each system ends where a 6-step run then a new 10-step run take it."""
    starts = [_crystal(18, 1.02), _crystal(19, 0.98, repeat=1)]
    fused = _batch(starts)
    (cls(ReferenceLJ(), n_steps=6) + cls(ReferenceLJ(), n_steps=10, alpha=40.0)).run(fused)
    assert fused.status.tolist() == [2, 2]
    for s, start in enumerate(starts):
        first = _batch([start])
        cls(ReferenceLJ(), n_steps=6).run(first)
        second = _batch(first.to_atoms())  # (running `first` again would continue its history)
        cls(ReferenceLJ(), n_steps=10, alpha=40.0).run(second)
        torch.testing.assert_close(fused.positions[_rows(fused, s)], second.positions, rtol=0, atol=1e-10)


def test_fused_lbfgs_stages_with_different_memories_are_an_error() -> None:
    fused = LBFGS(ReferenceLJ(), n_steps=2, memory=5) + LBFGS(ReferenceLJ(), n_steps=2, memory=8)
    with pytest.raises(ConfigurationError, match="give them the same memory"):
        fused.run(_batch([_crystal(20, repeat=1)]))


def test_bfgs_refuses_a_system_larger_than_its_hessians() -> None:
    data = [_data(_crystal(15, repeat=1)), _data(_crystal(16))]
    sampler = SizeAwareSampler(ListDataset(data), max_atoms=40, max_batch_size=1, bin_width=1, shuffle=False)
    relax = BFGS(ReferenceLJ(), n_steps=5, max_atoms=4, sampler=sampler, sinks=[HostMemory()])
    with pytest.raises(ConfigurationError, match=r"a system of 32 atoms entered.*max_atoms=32"):
        relax.run()


def test_bfgs_step_cannot_be_captured() -> None:
    with pytest.raises(ConfigurationError, match="cannot be captured"):
        BFGS(ReferenceLJ()).compile()


@pytest.mark.parametrize("cls", [LBFGS, BFGS])
def test_float32_follows_float64(cls: type) -> None:
    """The same relaxation in float32 stays within float32's rounding of the float64 one."""
    start = _crystal(17, 1.02)
    runs = []
    for dtype in (torch.float64, torch.float32):
        batch = Batch.from_atoms([start], dtype=dtype)
        cls(ReferenceLJ(), n_steps=10).run(batch)
        runs.append(batch.positions.double())
    torch.testing.assert_close(runs[1], runs[0], rtol=0, atol=1e-4)
