"""WrapPeriodicHook against ASE's wrap, energies of a periodic model unchanged."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

ase = pytest.importorskip("ase")
from ase.calculators.lj import LennardJones  # noqa: E402
from ase.geometry import complete_cell as ase_complete_cell  # noqa: E402
from ase.geometry import wrap_positions  # noqa: E402

from alchemi_core.data import AtomicData, Batch  # noqa: E402
from alchemi_core.dynamics import DemoDynamics, StepContext  # noqa: E402
from alchemi_core.errors import ConfigurationError  # noqa: E402
from alchemi_hooks.wrap import WrapPeriodicHook, complete_cell  # noqa: E402

CELLS = [
    [[5.0, 0.0, 0.0], [1.2, 4.5, 0.0], [0.7, -0.9, 6.0]],  # triclinic
    [[4.0, 0.0, 0.0], [0.0, 4.0, 0.0], [0.0, 0.0, 0.0]],  # slab: c absent
    [[3.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],  # wire along a
    [[6.0, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 5.5]],
]
PBC = [[True, True, True], [True, True, False], [True, False, False], [True, False, True]]


def periodic_batch(seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    data = []
    for cell, pbc in zip(CELLS, PBC, strict=True):
        frac = torch.rand(6, 3, generator=g, dtype=torch.float64) * 3.0 - 1.0  # well outside [0, 1)
        full = torch.tensor(ase_complete_cell(np.array(cell)))
        data.append(
            AtomicData(
                atomic_numbers=torch.full((6,), 18),
                positions=(frac @ full).to(dtype),
                cell=torch.tensor(cell, dtype=dtype),
                pbc=torch.tensor(pbc),
            )
        )
    return Batch.from_data_list(data)


def test_complete_cell_is_perpendicular_like_ase_where_it_matters():
    cells = torch.tensor(CELLS, dtype=torch.float64)
    done = complete_cell(cells)
    assert torch.equal(done[0], cells[0]) and torch.equal(done[3], cells[3])
    assert torch.allclose(done[1], torch.tensor(ase_complete_cell(np.array(CELLS[1]))))
    wire = done[2]
    assert abs(torch.det(wire)) > 1e-6
    assert abs(float(wire[0] @ wire[1])) < 1e-12 and abs(float(wire[0] @ wire[2])) < 1e-12
    assert torch.equal(complete_cell(torch.zeros(1, 3, 3, dtype=torch.float64))[0], torch.eye(3, dtype=torch.float64))


def test_positions_match_ase_wrap_and_lie_inside_along_periodic_axes():
    batch = periodic_batch()
    before = batch.positions.clone()
    WrapPeriodicHook()(batch, SimpleNamespace(context=StepContext.standalone(batch, system_mask=None)))
    for row, (cell, pbc) in enumerate(zip(CELLS, PBC, strict=True)):
        lo, hi = int(batch.batch_ptr[row]), int(batch.batch_ptr[row + 1])
        want = wrap_positions(before[lo:hi].numpy(), np.array(cell), pbc=pbc, eps=0.0)
        assert np.allclose(batch.positions[lo:hi].numpy(), want, atol=1e-10)
        full = ase_complete_cell(np.array(cell))
        frac = np.linalg.solve(full.T, batch.positions[lo:hi].numpy().T).T
        old = np.linalg.solve(full.T, before[lo:hi].numpy().T).T
        periodic = np.array(pbc)
        assert (frac[:, periodic] >= -1e-12).all() and (frac[:, periodic] < 1 + 1e-12).all()
        assert np.allclose(frac[:, ~periodic], old[:, ~periodic], atol=1e-12)  # untouched


def test_periodic_energy_is_unchanged_by_the_wrap():
    batch = periodic_batch(seed=3)
    before = batch.positions.clone()
    WrapPeriodicHook()(batch, SimpleNamespace(context=StepContext.standalone(batch, system_mask=None)))
    for row in (0, 3):  # 3D-periodic cells, where ASE's Lennard-Jones is defined without vacuum
        lo, hi = int(batch.batch_ptr[row]), int(batch.batch_ptr[row + 1])
        energies = []
        for pos in (before[lo:hi], batch.positions[lo:hi]):
            atoms = ase.Atoms("Ar6", positions=pos.numpy(), cell=CELLS[row], pbc=PBC[row])
            atoms.calc = LennardJones(sigma=1.0, epsilon=0.01, rc=2.2)
            energies.append(atoms.get_potential_energy())
        assert not np.allclose(before[lo:hi].numpy(), batch.positions[lo:hi].numpy())
        assert energies[0] == pytest.approx(energies[1], rel=1e-10, abs=1e-12)


def test_only_the_stage_systems_are_wrapped():
    batch = periodic_batch()
    before = batch.positions.clone()
    WrapPeriodicHook()(batch, SimpleNamespace(context=StepContext.standalone(batch, system_mask=torch.tensor([False, True, False, True]))))
    untouched = (batch.batch_idx == 0) | (batch.batch_idx == 2)
    assert torch.equal(batch.positions[untouched], before[untouched])
    assert not torch.equal(batch.positions[~untouched], before[~untouched])


class MinimumImageHarmonic:
    """A periodic model for the engine: springs between neighbours by minimum image."""

    def __call__(self, batch, compute_stress=False):
        pos, idx = batch.positions, batch.batch_idx
        cell = batch.cell
        inv = torch.linalg.inv(cell)
        i = torch.arange(batch.num_nodes)
        j = torch.where(idx.roll(-1) == idx, i.roll(-1), batch.batch_ptr[idx])  # ring per system
        d = pos[j] - pos[i]
        frac = torch.bmm(d.unsqueeze(1), inv[idx]).squeeze(1)
        frac = frac - torch.round(frac)
        d = torch.bmm(frac.unsqueeze(1), cell[idx]).squeeze(1)
        r = d.norm(dim=1)
        e = 0.5 * (r - 1.5) ** 2
        energy = torch.zeros(batch.num_graphs, 1, dtype=pos.dtype).index_add_(0, idx, e.unsqueeze(-1))
        g = ((r - 1.5) / r).unsqueeze(-1) * d
        forces = torch.zeros_like(pos).index_add_(0, i, g).index_add_(0, j, -g)
        return {"energy": energy, "forces": forces}


def test_md_energies_and_fractional_trajectory_are_the_same_with_and_without_wrapping():
    def cubic():
        g = torch.Generator().manual_seed(1)
        data = [
            AtomicData(
                atomic_numbers=torch.full((5,), 18),
                positions=torch.rand(5, 3, generator=g, dtype=torch.float64) * 4.0,
                velocities=torch.randn(5, 3, generator=g, dtype=torch.float64) * 0.05,
                cell=torch.eye(3, dtype=torch.float64) * 4.0,
                pbc=torch.tensor([True, True, True]),
            )
            for _ in range(2)
        ]
        return Batch.from_data_list(data)

    plain, wrapped = cubic(), cubic()
    energies = {"plain": [], "wrapped": []}

    class Energy:
        stage = WrapPeriodicHook.stage
        frequency = 10

        def __init__(self, key):
            self.key = key

        def __call__(self, b, d):
            energies[self.key].append(b.energy.clone())

    DemoDynamics(model=MinimumImageHarmonic(), n_steps=101, dt=1.0, hooks=[Energy("plain")]).run(plain)
    DemoDynamics(
        model=MinimumImageHarmonic(), n_steps=101, dt=1.0, hooks=[WrapPeriodicHook(frequency=10), Energy("wrapped")]
    ).run(wrapped)
    assert torch.allclose(torch.stack(energies["plain"]), torch.stack(energies["wrapped"]), atol=1e-10)
    frac = wrapped.positions / 4.0  # the last step (100) wrapped
    assert (frac >= 0).all() and (frac < 1).all()
    assert ((plain.positions / 4.0 < 0) | (plain.positions / 4.0 >= 1)).any()  # atoms did leave
    shift = (plain.positions - wrapped.positions) / 4.0
    assert torch.allclose(shift, torch.round(shift), atol=1e-8)  # whole lattice vectors apart


def test_a_batch_without_pbc_is_rejected():
    batch = Batch.from_data_list([AtomicData(atomic_numbers=[1], positions=[[0.0, 0.0, 0.0]])])
    md = DemoDynamics(model=lambda b, compute_stress=False: {"energy": torch.zeros(1, 1), "forces": torch.zeros(1, 3)},
                      n_steps=1, hooks=[WrapPeriodicHook()])
    with pytest.raises(ConfigurationError, match="pbc"):
        md.run(batch)
