"""ASE structures in and out losslessly: constraints, tags, charges, magnetic moments, info, cell,
pbc; frozen atoms held exactly; relaxed structures carry no optimiser velocities."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("ase")
pytest.importorskip("alchemi_potentials")
pytest.importorskip("alchemi_integrators")

import ase.io  # noqa: E402
from ase.build import bulk, fcc111, molecule  # noqa: E402
from ase.constraints import FixAtoms, FixBondLength, FixCartesian  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from alchemi_core import registry  # noqa: E402
from alchemi_core.data import AtomicData, Batch  # noqa: E402
from alchemi_core.dynamics import ConvergenceHook  # noqa: E402
from alchemi_core.errors import InvalidDataError  # noqa: E402

CU_MORSE = {"D": 0.3429, "alpha": 1.3588, "r0": 2.866, "cutoff": 6.0}


def _slab():
    slab = fcc111("Cu", size=(2, 2, 4), vacuum=6.0, a=3.6)
    slab.set_constraint(FixAtoms(mask=slab.get_tags() >= 3))  # the two bottom layers
    slab.info["name"] = "cu111"
    slab.info["miller"] = np.array([1, 1, 1])
    slab.rattle(0.05, seed=1)  # moves only the free atoms: ASE applies the constraint
    return slab


def test_everything_ase_holds_comes_back():
    atoms = molecule("H2O", vacuum=4.0, pbc=(True, False, True))
    atoms.set_tags([1, 0, 2])
    atoms.set_initial_charges([-0.8, 0.4, 0.4])
    atoms.set_initial_magnetic_moments([[0, 0, 1.0], [0, 0.5, 0], [0, 0, 0]])
    atoms.info.update({"name": "water", "step": 7, "weight": 0.25, "ok": True, "dipole": np.array([0.1, 0.2, 0.3]),
                       "meta": {"source": "test", "ids": [1, 2]}})
    atoms.set_constraint(FixAtoms(indices=[0]))
    back = AtomicData.from_atoms(atoms, dtype=torch.float64).to_atoms()
    np.testing.assert_array_equal(back.get_tags(), [1, 0, 2])
    np.testing.assert_allclose(back.get_initial_charges(), [-0.8, 0.4, 0.4])
    np.testing.assert_allclose(back.get_initial_magnetic_moments(), atoms.get_initial_magnetic_moments())
    np.testing.assert_array_equal(back.pbc, [True, False, True])
    np.testing.assert_allclose(back.cell.array, atoms.cell.array)
    np.testing.assert_allclose(back.positions, atoms.positions)
    assert back.info["name"] == "water" and back.info["step"] == 7 and back.info["ok"] is True
    assert back.info["weight"] == 0.25 and back.info["meta"] == {"source": "test", "ids": [1, 2]}
    np.testing.assert_allclose(back.info["dipole"], [0.1, 0.2, 0.3])
    assert [c.get_indices().tolist() for c in back.constraints] == [[0]]
    assert not back.has("momenta")  # zero velocities are not written back


def test_fix_cartesian_of_all_components_freezes_and_others_are_errors():
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
    atoms.set_constraint(FixCartesian([1, 2], mask=(True, True, True)))
    assert AtomicData.from_atoms(atoms).frozen.tolist() == [False, True, True, False]
    assert "frozen_axes" not in AtomicData.from_atoms(atoms)
    atoms.set_constraint(FixBondLength(0, 1))
    with pytest.raises(InvalidDataError, match="FixBondLength.*cannot honour"):
        Batch.from_atoms([atoms])


def test_fix_cartesian_of_some_components_holds_them_and_comes_back():
    """Partial ``FixCartesian`` becomes ``frozen_axes`` rows; back in ASE, atoms held whole are one
    ``FixAtoms`` and each pattern of components one ``FixCartesian``, in a batch with a structure
    without constraints too."""
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 1, 1))
    atoms.set_constraint([FixAtoms([0]), FixCartesian([1, 2], mask=(True, False, True)),
                          FixCartesian([3], mask=(False, False, True)), FixCartesian([4], mask=(True, True, True))])
    data = AtomicData.from_atoms(atoms)
    assert data.frozen.tolist() == [True, False, False, False, True, False, False, False]
    assert data.frozen_axes.int().tolist() == [[0, 0, 0], [1, 0, 1], [1, 0, 1], [0, 0, 1]] + [[0, 0, 0]] * 4
    batch = Batch.from_atoms([bulk("Cu", "fcc", a=3.6, cubic=True), atoms])
    plain, back = batch.to_atoms()
    assert not plain.constraints
    assert [(type(c).__name__, c.get_indices().tolist(), getattr(c, "mask", np.ones(3, bool)).tolist())
            for c in back.constraints] == [
        ("FixAtoms", [0, 4], [True, True, True]),
        ("FixCartesian", [3], [False, False, True]),
        ("FixCartesian", [1, 2], [True, False, True]),
    ]


def test_a_batch_of_mixed_structures_gets_ase_defaults_and_each_keeps_its_own_info():
    a, b, c = (bulk("Cu", "fcc", a=3.6, cubic=True) for _ in range(3))
    a.set_tags([1, 1, 0, 0])
    a.set_constraint(FixAtoms(indices=[0]))
    batch = Batch.from_atoms([a, b])
    assert batch.tags.tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
    assert batch.frozen.tolist() == [True] + [False] * 7
    # Keys only some structures have, in another form, or arrays of another length (ase.build's
    # slabs carry an adsorbate_info dict that bulk cells lack).
    a.info.update(name="a", energy_ref=-3.5, seen=np.arange(3))
    b.info.update(energy_ref="unknown", seen=np.arange(5), adsorbate_info={"top": [0.0, 0.0]})
    c.info.update(name="c", energy_ref=-1.25, seen=np.arange(2))
    back = Batch.from_atoms([a, b, c], dtype=torch.float64).to_atoms()
    for want, got in zip((a, b, c), back, strict=True):
        assert sorted(got.info) == sorted(want.info)
        for key, value in want.info.items():
            assert np.array_equal(np.asarray(got.info[key]), np.asarray(value)) or got.info[key] == value, key


def test_a_fixed_slab_relaxes_with_its_bottom_layers_unmoved_and_no_leftover_velocities():
    slab = _slab()
    fixed = slab.constraints[0].get_indices()
    model = registry.build("model:morse", **CU_MORSE)
    fire = registry.build("integrator:fire", model=model, n_steps=400, dt=1.0,
                          convergence_hook=ConvergenceHook.from_fmax(0.05))
    out = fire.run(Batch.from_atoms([slab], dtype=torch.float64))
    assert out.status.tolist() == [1]  # converged
    relaxed = out.to_atoms()[0]
    assert np.abs(relaxed.positions[fixed] - slab.positions[fixed]).max() <= 1e-12
    free = np.setdiff1d(np.arange(len(slab)), fixed)
    assert np.abs(relaxed.positions[free] - slab.positions[free]).max() > 1e-3  # the rest did relax
    assert not relaxed.has("momenta")  # FIRE's velocities are not the atoms'
    assert relaxed.constraints[0].get_indices().tolist() == fixed.tolist()
    # fmax counts only the atoms that move, as ASE's does.
    np.testing.assert_allclose(float(out.fmax[0]), np.linalg.norm(relaxed.get_forces(), axis=1).max(), rtol=1e-6)


def test_the_slab_through_alchemi_run_and_export_keeps_constraint_tags_and_info(tmp_path, monkeypatch):
    pytest.importorskip("alchemi_zarr")
    from alchemi_core.cli import main

    monkeypatch.chdir(tmp_path)
    slab = _slab()
    ase.io.write("slab.extxyz", [slab])
    slab = ase.io.read("slab.extxyz")  # the input as the run sees it (extended XYZ keeps 8 decimals)
    (tmp_path / "relax.toml").write_text(
        '[model]\ncomponent = "model:morse"\n' + "".join(f"{k} = {v}\n" for k, v in CU_MORSE.items())
        + '[input]\npath = "slab.extxyz"\ndtype = "float64"\n'
        + '[[stage]]\ncomponent = "integrator:fire"\nn_steps = 400\ndt = 1.0\nconverge = { fmax = 0.05 }\n'
        + '[output]\npath = "slab.zarr"\n'
    )
    runner = CliRunner()
    result = runner.invoke(main, ["run", "relax.toml", "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    for out in ("relaxed.extxyz", "relaxed.traj"):
        result = runner.invoke(main, ["export", "slab.zarr", out], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        (back,) = ase.io.read(out, index=":")
        fixed = slab.constraints[0].get_indices()
        assert [c.get_indices().tolist() for c in back.constraints] == [fixed.tolist()]
        np.testing.assert_array_equal(back.get_tags(), slab.get_tags())
        assert back.info["name"] == "cu111" and back.info["source_file"] == "slab.extxyz"
        np.testing.assert_array_equal(back.info["miller"], [1, 1, 1])
        tol = 1e-7 if out.endswith(".extxyz") else 1e-12  # extended XYZ keeps 8 decimals
        assert np.abs(back.positions[fixed] - slab.positions[fixed]).max() <= tol
        assert not back.has("momenta")


@pytest.mark.parametrize("per_axis", [False, True])
def test_a_slab_relaxed_then_heated_by_alchemi_run_keeps_fixed_atoms_and_components(tmp_path, monkeypatch, per_axis):
    """Relax-then-MD, as users write it: an extended XYZ slab whose two bottom layers carry
    ``FixAtoms`` (and, ``per_axis``, two top atoms a ``FixCartesian`` of x and z), through ``alchemi
    run`` (FIRE, then Langevin at 300 K with 5 fs steps) and ``alchemi export``: the fixed atoms and
    components are where the input had them and the constraints come back."""
    pytest.importorskip("alchemi_zarr")
    from alchemi_core.cli import main

    monkeypatch.chdir(tmp_path)
    slab = _slab()
    top = np.flatnonzero(slab.get_tags() == 1)[:2] if per_axis else np.zeros(0, dtype=int)
    if per_axis:
        slab.set_constraint([slab.constraints[0], FixCartesian(top, mask=(True, False, True))])
    ase.io.write("slab.extxyz", [slab])
    slab = ase.io.read("slab.extxyz")  # the input as the run sees it
    (tmp_path / "md.toml").write_text(
        '[model]\ncomponent = "model:morse"\n' + "".join(f"{k} = {v}\n" for k, v in CU_MORSE.items())
        + '[input]\npath = "slab.extxyz"\ndtype = "float64"\n'
        + '[[stage]]\ncomponent = "integrator:fire"\nn_steps = 100\ndt = 1.0\nconverge = { fmax = 0.05 }\n'
        + '[[stage]]\ncomponent = "integrator:langevin"\nn_steps = 100\ndt = 5.0\n'
        + 'temperature = 300.0\ninitial_temperature = 300.0\nrandom_seed = 1\n'
        + '[output]\npath = "slab.zarr"\n'
    )
    runner = CliRunner()
    result = runner.invoke(main, ["run", "md.toml", "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["export", "slab.zarr", "out.traj"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (back,) = ase.io.read("out.traj", index=":")
    whole = np.flatnonzero(slab.get_tags() >= 3)
    assert np.array_equal(back.positions[whole], slab.positions[whole])
    assert [(type(c).__name__, c.get_indices().tolist()) for c in back.constraints] == [
        ("FixAtoms", whole.tolist())] + [("FixCartesian", top.tolist())] * per_axis
    if per_axis:
        assert back.constraints[1].mask.tolist() == [True, False, True]
        assert np.array_equal(back.positions[top][:, [0, 2]], slab.positions[top][:, [0, 2]])
        assert np.abs(back.positions[top][:, 1] - slab.positions[top][:, 1]).min() > 1e-3  # y is free
    free = np.setdiff1d(np.arange(len(slab)), np.concatenate([whole, top]))
    assert np.abs(back.positions[free] - slab.positions[free]).max() > 0.05  # 100 steps at 300 K
    velocities = back.get_velocities()
    assert not velocities[whole].any() and not velocities[top][:, [0, 2]].any()
    assert velocities[free].any()


def test_fixsymmetry_and_fixcom_through_alchemi_run_and_export(tmp_path, monkeypatch):
    """A rattled bcc cell with ``FixSymmetry`` and ``FixCom`` in an ASE trajectory, relaxed with
    the Frechet filter by ``alchemi run`` and exported: both constraints come back (with their
    ``symprec``) and the relaxed cell is Im-3m to 1e-5 Å."""
    pytest.importorskip("alchemi_zarr")
    spglib = pytest.importorskip("spglib")
    from ase.constraints import FixCom, FixSymmetry

    from alchemi_core.cli import main

    monkeypatch.chdir(tmp_path)
    start = bulk("Ar", "bcc", a=4.46, cubic=True)
    start.positions += np.random.default_rng(0).normal(size=(2, 3)) * 0.001
    start.set_constraint([FixSymmetry(start.copy(), symprec=0.01), FixCom()])
    ase.io.write("bcc.traj", [start])
    (tmp_path / "relax.toml").write_text(
        '[model]\ncomponent = "model:lennard-jones"\nepsilon = 0.0104\nsigma = 3.405\ncutoff = 8.5125\n'
        '[input]\npath = "bcc.traj"\ndtype = "float64"\n'
        '[[stage]]\ncomponent = "integrator:fire"\nn_steps = 2000\ncell_filter = "frechet"\n'
        'converge = { fmax = 0.001 }\n[output]\npath = "bcc.zarr"\n'
    )
    runner = CliRunner()
    result = runner.invoke(main, ["run", "relax.toml", "--no-progress"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["export", "bcc.zarr", "relaxed.traj"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    back = ase.io.read("relaxed.traj")
    assert [type(c) for c in back.constraints] == [FixSymmetry, FixCom]
    assert back.constraints[0].symprec == 0.01
    assert abs(back.cell.array[0, 0] - start.cell.array[0, 0]) > 0.1, "the cell relaxed"
    cell = (back.cell.array, back.get_scaled_positions(), back.numbers)
    assert spglib.get_symmetry_dataset(cell, symprec=1e-5).number == 229
