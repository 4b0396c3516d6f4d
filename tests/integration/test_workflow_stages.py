"""Workflow stages take every parameter their component's constructor takes, checked against its
signature and annotations (issue 59, item 9): a Frechet relaxation under pressure is a workflow,
and its result is the one the same relaxation written in Python gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("ase")
pytest.importorskip("alchemi_zarr")
pytest.importorskip("alchemi_potentials")
pytest.importorskip("alchemi_integrators")

import ase.io  # noqa: E402
from ase.build import bulk  # noqa: E402

from alchemi_core import registry, units  # noqa: E402
from alchemi_core.workflow import parse_workflow, run_workflow  # noqa: E402
from alchemi_core.workflow.spec import WorkflowError  # noqa: E402

MODEL = {"epsilon": 0.0104, "sigma": 3.405, "cutoff": 8.5125, "shift_energy": True}
PRESSURE = 0.3 * units.GPA
FMAX = 1e-3
MODEL_TOML = f"""
[model]
component = "model:lennard-jones"
epsilon = {MODEL['epsilon']}
sigma = {MODEL['sigma']}
cutoff = {MODEL['cutoff']}"""


def _cells(path):
    """Strained, rattled argon cells (one stretched, one squeezed, one sheared), written to an
    extxyz file: the workflow reads the file, the Python run the same file read back."""
    frames = []
    for seed, (strain, shear) in enumerate(((1.05, 0.0), (0.97, 0.0), (1.0, 0.04))):
        atoms = bulk("Ar", "fcc", a=5.26 * strain, cubic=True)
        cell = atoms.cell.array.copy()
        cell[0, 1] += shear * cell[0, 0]
        atoms.set_cell(cell, scale_atoms=True)
        atoms.rattle(0.03, seed=seed)
        frames.append(atoms)
    ase.io.write(path, frames)
    return ase.io.read(path, index=":")


def _workflow(component, structures, store, extra=""):
    return parse_workflow(f"""{MODEL_TOML}
shift_energy = true

[input]
path = "{structures}"
dtype = "float64"

[[stage]]
component = "{component}"
n_steps = 3000
dt = 5.0
dt_max = 50.0
cell_filter = "frechet"
scalar_pressure = {PRESSURE!r}
{extra}
converge = {{ fmax = {FMAX}, frequency = 10 }}

[output]
path = "{store}"
log = false
""")


@pytest.mark.parametrize("component", ["integrator:fire", "integrator:fire2"])
def test_a_frechet_relaxation_under_pressure_as_a_workflow_equals_it_in_python(tmp_path, component):
    from alchemi_core.data import Batch
    from alchemi_core.dynamics import ConvergenceHook
    from alchemi_zarr import AtomicDataZarrReader

    atoms = _cells(tmp_path / "cells.extxyz")
    store = tmp_path / "results.zarr"
    summary = run_workflow(_workflow(component, tmp_path / "cells.extxyz", store), device="cpu", progress=False)
    assert summary.structures_out == 3
    reader = AtomicDataZarrReader(store)
    stored = sorted((reader[i] for i in range(len(reader))), key=lambda d: int(d.system_id))

    batch = Batch.from_atoms(atoms, dtype=torch.float64)
    model = registry.build("model:lennard-jones", **MODEL)
    relax = registry.build(component, model=model, n_steps=3000, dt=5.0, dt_max=50.0, cell_filter="frechet",
                           scalar_pressure=PRESSURE, convergence_hook=ConvergenceHook.from_fmax(FMAX, frequency=10))
    relax.run(batch)
    assert (batch.status == 1).all()
    assert [int(d.status) for d in stored] == [1, 1, 1]
    for i, data in enumerate(stored):
        rows = batch.batch_idx == i
        torch.testing.assert_close(data.cell[0], batch.cell[i], rtol=0, atol=1e-9)
        torch.testing.assert_close(data.positions, batch.positions[rows], rtol=0, atol=1e-9)
        torch.testing.assert_close(data.energy.reshape(-1), batch.energy[i].reshape(-1), rtol=0, atol=1e-9)
    # The relaxation went somewhere: the cells changed, to the pressure asked for (stress = -p,
    # to the residual an fmax of 1e-3 eV/Å leaves: about fmax N / V).
    first = torch.tensor(atoms[0].cell.array)
    assert (stored[0].cell[0] - first).abs().max() > 0.05
    stress = torch.stack([d.stress.reshape(3, 3) for d in stored]) if "stress" in stored[0] else None
    if stress is not None:
        np.testing.assert_allclose(torch.diagonal(stress, dim1=1, dim2=2).numpy(), -PRESSURE, atol=1e-4)


@pytest.mark.parametrize(
    ("line", "key", "hint"),
    [
        ("hydrostatic_strain = 1", "stage[0].hydrostatic_strain", "must be true or false"),
        ('mask = "xy"', "stage[0].mask", "must be an array of true or false"),
        ("constant_volum = true", "stage[0].constant_volum", "did you mean 'constant_volume'"),
        ('scalar_pressure_ = "hot"', "stage[0].scalar_pressure_", "did you mean 'scalar_pressure'"),
        ("cell_factor = true", "stage[0].cell_factor", "must be a number"),
    ],
)
def test_cell_filter_options_are_checked_by_the_constructors_signature(tmp_path, line, key, hint):
    with pytest.raises(WorkflowError) as err:
        _workflow("integrator:fire", tmp_path / "cells.extxyz", tmp_path / "r.zarr", line)
    assert err.value.key == key and hint in str(err.value), str(err.value)


def test_documented_cell_filter_options_are_accepted(tmp_path):
    wf = _workflow("integrator:fire2", tmp_path / "cells.extxyz", tmp_path / "r.zarr",
                   "hydrostatic_strain = false\nconstant_volume = true\nmask = [true, true, true, false, false, false]")
    assert wf.stages[0].component.params["mask"] == [True, True, True, False, False, False]
    wf = _workflow("integrator:fire", tmp_path / "cells.extxyz", tmp_path / "r.zarr", "hydrostatic_strain = true")
    assert wf.stages[0].component.params["hydrostatic_strain"] is True
    # A per-system parameter takes a number or each structure's own info value, not any string.
    with pytest.raises(WorkflowError, match=r'stage\[0\]\.maxstep: must be a number or "info_<key>"'):
        _workflow("integrator:fire", tmp_path / "cells.extxyz", tmp_path / "r.zarr", 'maxstep = "hot"')


def _md_workflow(structures, store, stages=("integrator:langevin",), resume=None):
    text = f"""{MODEL_TOML}

[input]
path = "{structures}"
{'' if resume is None else f'resume_status = {str(resume).lower()}'}
"""
    for component in stages:
        text += f"""
[[stage]]
component = "{component}"
n_steps = 20
dt = 5.0
"""
        text += "converge = { fmax = 0.05 }\n" if "fire" in component else "temperature = 50.0\n"
    return parse_workflow(text + f'\n[output]\npath = "{store}"\n')


def test_a_store_as_input_runs_its_structures_from_the_first_stage(tmp_path):
    """A finished store as input: its structures (status 1) used to go straight to the sinks,
    0 engine steps; now each starts at the first stage again."""
    from alchemi_core.workflow.logs import read_log
    from alchemi_zarr import AtomicDataZarrReader

    _cells(tmp_path / "cells.extxyz")
    first = run_workflow(_md_workflow(tmp_path / "cells.extxyz", tmp_path / "first.zarr", ("integrator:fire",)),
                         device="cpu", progress=False)
    assert first.structures_out == 3
    assert AtomicDataZarrReader(tmp_path / "first.zarr").read_batch().status.tolist() == [1, 1, 1]
    again = run_workflow(_md_workflow(tmp_path / "first.zarr", tmp_path / "second.zarr"), device="cpu", progress=False)
    assert again.steps >= 20 and again.structures_out == 3
    before = AtomicDataZarrReader(tmp_path / "first.zarr").read_batch()
    after = AtomicDataZarrReader(tmp_path / "second.zarr").read_batch()
    assert after.status.tolist() == [1, 1, 1]  # the one Langevin stage done
    assert not torch.equal(before.positions, after.positions)
    assert set(np.asarray(read_log(tmp_path / "second.log.csv")["stage"]).tolist()) == {0}


def test_resume_status_continues_each_structure_at_its_stored_stage(tmp_path):
    from alchemi_core.workflow.logs import read_log
    from alchemi_zarr import AtomicDataZarrReader

    _cells(tmp_path / "cells.extxyz")
    run_workflow(_md_workflow(tmp_path / "cells.extxyz", tmp_path / "relaxed.zarr", ("integrator:fire",)),
                 device="cpu", progress=False)
    both = ("integrator:fire", "integrator:langevin")
    # Status 1 (relaxed) names the second stage of relax-then-MD: only the MD runs.
    run_workflow(_md_workflow(tmp_path / "relaxed.zarr", tmp_path / "md.zarr", both, resume=True), device="cpu",
                 progress=False)
    assert AtomicDataZarrReader(tmp_path / "md.zarr").read_batch().status.tolist() == [2, 2, 2]
    assert set(np.asarray(read_log(tmp_path / "md.log.csv")["stage"]).tolist()) == {1}
    # Without it, both stages run again.
    run_workflow(_md_workflow(tmp_path / "relaxed.zarr", tmp_path / "all.zarr", both, resume=False), device="cpu",
                 progress=False)
    assert set(np.asarray(read_log(tmp_path / "all.log.csv")["stage"]).tolist()) == {0, 1}
    # Finished structures have no stage to continue at: an error naming the key, not a run of nothing.
    with pytest.raises(WorkflowError) as err:
        run_workflow(_md_workflow(tmp_path / "md.zarr", tmp_path / "none.zarr", both, resume=True), device="cpu",
                     progress=False)
    assert err.value.key == "input.resume_status" and "status 2" in str(err.value)
    assert not (tmp_path / "none.zarr").exists()
