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
    return parse_workflow(f"""
[model]
component = "model:lennard-jones"
epsilon = {MODEL['epsilon']}
sigma = {MODEL['sigma']}
cutoff = {MODEL['cutoff']}
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
