"""``alchemi run`` end to end in a fresh process, for a model plugin's own test environment.

A model plugin's tests call :func:`run_workflow_cli` with the TOML of its ``[model]`` table: it
writes two small silicon cells, a workflow that relaxes them (FIRE) and then runs a few steps
of Langevin MD into a results store, and runs ``python -m alchemi_core.cli run`` on it, as a
user would. It needs ASE and ``alchemi-zarr`` (the store), ``alchemi-integrators`` and
``alchemi-hooks`` installed in that environment: an environment without one fails here the way
``alchemi run`` fails for its users.

Example (in a plugin's tests)::

    def test_alchemi_run_end_to_end(tmp_path):
        summary, store = run_workflow_cli(tmp_path, 'component = "model:sevennet"\\nmodel = "7net-0"')
        assert summary["structures_out"] == 2
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

WORKFLOW = """\
[model]
{model}

[input]
path = "si.extxyz"
dtype = "{dtype}"

[[stage]]
component = "integrator:fire"
n_steps = 5
dt = 1.0
converge = {{ fmax = 0.05 }}

[[stage]]
component = "integrator:langevin"
n_steps = 5
dt = 1.0
temperature = 300.0
initial_temperature = 300.0

[output]
path = "results.zarr"
"""


def run_workflow_cli(folder: str | os.PathLike[str], model_toml: str, dtype: str = "float32",
                     timeout: float = 600.0) -> tuple[dict[str, Any], Path]:
    """Run a two-stage workflow of ``[model]`` ``model_toml`` with ``alchemi run`` in a subprocess.

    Returns:
        The run's JSON summary and the path of its results store.

    Raises:
        AssertionError: ``alchemi run`` failed (its output is in the message).
    """
    import ase.io
    from ase.build import bulk

    folder = Path(folder)
    cells = []
    for seed in range(2):
        atoms = bulk("Si", "diamond", a=5.43, cubic=True)
        atoms.rattle(0.05, seed=seed)
        cells.append(atoms)
    ase.io.write(folder / "si.extxyz", cells)
    (folder / "workflow.toml").write_text(WORKFLOW.format(model=model_toml, dtype=dtype))
    done = subprocess.run(
        [sys.executable, "-m", "alchemi_core.cli", "run", "workflow.toml", "--device", "cpu", "--json"],
        cwd=folder, capture_output=True, text=True, timeout=timeout, check=False,
    )
    assert done.returncode == 0, f"alchemi run exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout), folder / "results.zarr"
