"""Kinetic energy, temperature and Maxwell-Boltzmann velocities, checked against ASE and statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from ase import units
from integrators_testkit.lj_reference import argon

from alchemi_core.data import AtomicData, Batch
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_core.units import KB
from alchemi_integrators.thermo import (
    center_of_mass_velocity,
    degrees_of_freedom,
    initialize_velocities,
    kinetic_energy,
    temperature,
)


def _molecules(sizes: list[int], seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    data = [
        AtomicData(
            atomic_numbers=torch.randint(1, 30, (n,), generator=g),
            positions=torch.randn(n, 3, generator=g, dtype=torch.float64),
            atomic_masses=torch.rand(n, generator=g, dtype=torch.float64) * 50 + 1,
        )
        for n in sizes
    ]
    return Batch.from_data_list(data)


def test_kinetic_energy_and_temperature_match_ase() -> None:
    batch = _molecules([5, 9, 2])
    initialize_velocities(batch, 500.0, seed=4, remove_com=False)
    ke, t3n = kinetic_energy(batch), temperature(batch, com_fixed=False)
    for i, atoms in enumerate(batch.to_atoms()):
        # AtomicData.to_atoms carries velocities (Å/fs) into ASE. ASE's constants are CODATA 2014,
        # alchemi's CODATA 2018: eV/amu/Å/fs conversions differ by 1e-8, kB by 3.4e-7.
        assert ke[i].item() == pytest.approx(atoms.get_kinetic_energy(), rel=1e-7)
        assert t3n[i].item() == pytest.approx(atoms.get_temperature(), rel=1e-6)
    n = torch.tensor([5.0, 9.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(temperature(batch), t3n * 3 * n / (3 * n - 3))


def test_degrees_of_freedom_never_zero() -> None:
    batch = _molecules([1, 4])
    assert degrees_of_freedom(batch).tolist() == [1.0, 9.0]
    assert degrees_of_freedom(batch, com_fixed=False).tolist() == [3.0, 12.0]


def test_com_removed_per_system_and_seed_reproducible() -> None:
    batch = _molecules([6, 3, 8])
    v1 = initialize_velocities(batch, 300.0, seed=11).clone()
    assert center_of_mass_velocity(batch).abs().max().item() < 1e-15
    v2 = initialize_velocities(batch, 300.0, seed=11).clone()
    v3 = initialize_velocities(batch, 300.0, seed=12).clone()
    torch.testing.assert_close(v1, v2, rtol=0, atol=0)
    assert not torch.allclose(v1, v3)


def test_maxwell_boltzmann_statistics_per_system_temperature() -> None:
    """Mean temperature over many systems is the target (3N - 3 dof after COM removal), and
    each velocity component has variance kB T / m."""
    targets = torch.tensor([20.0, 300.0], dtype=torch.float64).repeat(200)
    batch = Batch.from_data_list([argon(1)] * targets.numel())  # 4 atoms each: 9 dof
    initialize_velocities(batch, targets, seed=0)
    t = temperature(batch)
    for target in (20.0, 300.0):
        sel = t[targets == target]
        # Each sample is T chi²_9 / 9: standard error of the mean of 200 is T sqrt(2/9/200).
        assert sel.mean().item() == pytest.approx(target, rel=4 * math.sqrt(2 / 9 / 200))
    # Unit-variance check of v sqrt(m / kB T) over all components (after COM removal the
    # variance is (N - 1)/N per component).
    m = batch.atomic_masses.unsqueeze(-1)
    t_atom = targets.index_select(0, batch.batch_idx).unsqueeze(-1)
    z = batch.velocities * torch.sqrt(m / (KB * t_atom * 9.648533212331e-3))
    assert z.var().item() == pytest.approx(3 / 4, rel=0.05)


def test_field_name_and_mask() -> None:
    batch = _molecules([4, 4, 4])
    batch.set_field("target_T", torch.tensor([10.0, 1000.0, 10.0], dtype=torch.float64), "system")
    before = torch.full_like(batch.positions, 7.0)
    batch.set_field("velocities", before.clone(), "node")
    mask = torch.tensor([False, True, False])
    initialize_velocities(batch, "target_T", seed=1, mask=mask)
    v = batch.velocities
    assert torch.equal(v[batch.batch_idx != 1], before[batch.batch_idx != 1])
    assert not torch.equal(v[batch.batch_idx == 1], before[batch.batch_idx == 1])


def test_bad_temperatures_are_clear_errors() -> None:
    batch = _molecules([3, 3])
    with pytest.raises(ConfigurationError, match="temperature must be >= 0"):
        initialize_velocities(batch, -5.0)
    with pytest.raises(InvalidDataError, match="2 systems"):
        initialize_velocities(batch, torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ConfigurationError, match="does not have"):
        initialize_velocities(batch, "nope")
    with pytest.raises(InvalidDataError, match="no velocities"):
        kinetic_energy(_molecules([2]))


def test_to_atoms_has_velocities() -> None:
    # Guard for the ASE comparison above: the velocities really reach ASE.
    batch = _molecules([3])
    initialize_velocities(batch, 100.0, seed=0)
    atoms = batch.to_atoms()[0]
    np.testing.assert_allclose(atoms.get_velocities() * units.fs, batch.velocities.numpy(), rtol=1e-12)


def test_held_atoms_and_components_do_not_count_as_ase_counts_them() -> None:
    """``frozen`` atoms take 3 degrees of freedom each and ``frozen_axes`` one per component,
    with no 3 more for the centre of mass (held atoms pin it): ASE's
    ``get_number_of_degrees_of_freedom`` under ``FixAtoms`` and ``FixCartesian``."""
    from ase.constraints import FixAtoms, FixCartesian

    batch = _molecules([5, 9, 2])
    frozen = torch.zeros(16, dtype=torch.bool)
    frozen[[0, 6]] = True
    axes = torch.zeros(16, 3, dtype=torch.bool)
    axes[1] = axes[14] = torch.tensor([True, False, True])
    batch.set_field("frozen", frozen, "node")
    batch.set_field("frozen_axes", axes, "node")
    ase_counts = []
    for i, atoms in enumerate(batch.to_atoms()):
        lo = int(batch.batch_ptr[i])
        atoms.set_constraint([FixAtoms(mask=frozen[lo:lo + len(atoms)].numpy())]
                             + [FixCartesian([j - lo], mask=axes[j].tolist()) for j in range(lo, lo + len(atoms))
                                if axes[j].any()])
        ase_counts.append(atoms.get_number_of_degrees_of_freedom())
    assert degrees_of_freedom(batch).tolist() == ase_counts == [15 - 3 - 2, 27 - 3, 6 - 2]
    assert degrees_of_freedom(batch, com_fixed=False).tolist() == ase_counts


def test_nose_hoover_heats_what_moves_to_its_temperature_when_atoms_are_held() -> None:
    """Half of an argon cell held (FixAtoms): the chain thermostats the free atoms' components to
    its temperature, counted as 3 per free atom (it would be nearly twice as hot if the held
    atoms counted)."""
    from integrators_testkit.lj_reference import ReferenceLJ
    from integrators_testkit.recording import Record

    from alchemi_integrators import NoseHooverChain

    batch = Batch.from_data_list([argon(2, rattle=0.05, seed=s) for s in range(2)])
    frozen = (torch.arange(batch.num_nodes) % 32) < 16
    batch.set_field("frozen", frozen, "node")
    record = Record(lambda b, d: kinetic_energy(b))
    NoseHooverChain(ReferenceLJ(), n_steps=400, dt=5.0, temperature=60.0, tau=40.0, initial_temperature=60.0,
                    random_seed=2, hooks=[record]).run(batch)
    measured = 2.0 * record.array()[150:].mean() / (3 * 16 * KB)  # 120 K when held atoms counted
    assert abs(measured - 60.0) < 6.0, measured


def test_fix_com_systems_count_three_fewer_degrees_of_freedom() -> None:
    """A system with the field ``fix_com`` (ASE's ``FixCom``) counts ``3N - 3`` even where the
    stage leaves the centre of mass free; held atoms pin it already (no 3 more)."""
    batch = _molecules([5, 4, 3])
    batch.set_field("fix_com", torch.tensor([True, False, True]), "system")
    assert degrees_of_freedom(batch, com_fixed=False).tolist() == [12.0, 12.0, 6.0]
    assert degrees_of_freedom(batch, com_fixed=True).tolist() == [12.0, 9.0, 6.0]
    frozen = torch.zeros(12, dtype=torch.bool)
    frozen[0] = True
    batch.set_field("frozen", frozen, "node")
    assert degrees_of_freedom(batch, com_fixed=False).tolist() == [12.0, 12.0, 6.0]
