"""``model:sum`` in a workflow file: ``[[model.parts]]`` tables, each a component with its own
arguments, checked part by part (errors name the part and the key) and built into the sum."""

from __future__ import annotations

import pytest
import torch
from ase.build import bulk

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.errors import ConfigurationError
from alchemi_core.workflow import WorkflowError, build_plan, parse_workflow

STAGE = """
[[stage]]
component = "integrator:fire"
n_steps = 1
"""

TWO_PARTS = """
[model]
component = "model:sum"

[[model.parts]]
component = "model:lennard-jones"
epsilon = 0.0104
sigma = 3.405
cutoff = 8.5

[[model.parts]]
component = "model:morse"
D = 0.01
alpha = 1.5
r0 = 3.8
cutoff = 7.0
""" + STAGE


def _crystals() -> Batch:
    atoms = [bulk("Ar", "fcc", a=5.3, cubic=True) * (2, 1, 1), bulk("Ar", "fcc", a=5.5, cubic=True)]
    for i, a in enumerate(atoms):
        a.rattle(0.05, seed=i)
    return Batch.from_atoms(atoms, dtype=torch.float64)


def test_each_part_takes_its_own_arguments_and_the_sum_is_theirs(tmp_path):
    workflow = parse_workflow(TWO_PARTS, base=tmp_path)
    assert workflow.describe()["model"]["parts"][1] == {"component": "model:morse", "D": 0.01, "alpha": 1.5,
                                                         "r0": 3.8, "cutoff": 7.0}
    total = build_plan(workflow, device="cpu").model
    batch = _crystals()
    lj = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5)
    morse = registry.build("model:morse", D=0.01, alpha=1.5, r0=3.8, cutoff=7.0)
    out = total(batch, compute_stress=True)
    for key in ("energy", "forces", "stress"):
        torch.testing.assert_close(out[key], lj(batch, compute_stress=True)[key] + morse(batch, compute_stress=True)[key])
    assert total.card.name == "lennard-jones+morse" and total.card.cutoff == 8.5


def test_parts_may_be_named_by_spec_alone(tmp_path):
    text = '[model]\ncomponent = "model:sum"\nparts = ["model:demo", "model:demo"]\n' + STAGE
    assert build_plan(parse_workflow(text, base=tmp_path), device="cpu").model.card.name == "demo+demo"


@pytest.mark.parametrize(("old", "new", "key", "hint"), [
    ("alpha = 1.5", "alpah = 1.5", "model.parts[1].alpah", "did you mean 'alpha'"),
    ("sigma = 3.405", 'sigma = "wide"', "model.parts[0].sigma", "must be a number"),
    ("sigma = 3.405\n", "", "model.parts[0].sigma", "missing: model:lennard-jones needs sigma"),
    ('component = "model:morse"', 'component = "model:morze"', "model.parts[1].component", "morse"),
    ('component = "model:morse"', 'component = "integrator:fire"', "model.parts[1].component", "is not a model"),
    ('component = "model:morse"', 'model = "model:morse"', "model.parts[1].component", "missing"),
    # model is an argument like any other: a part whose component takes none is told so
    ("cutoff = 7.0", 'cutoff = 7.0\nmodel = "7net-0"', "model.parts[1].model", "takes no parameter 'model'"),
])
def test_a_bad_part_is_named_by_its_index_and_key(tmp_path, old, new, key, hint):
    with pytest.raises(WorkflowError) as err:
        parse_workflow(TWO_PARTS.replace(old, new, 1), base=tmp_path)
    assert err.value.key == key
    assert hint in err.value.message


def test_parts_must_be_a_list_of_parts(tmp_path):
    text = '[model]\ncomponent = "model:sum"\nparts = 3\n' + STAGE
    with pytest.raises(WorkflowError) as err:
        parse_workflow(text, base=tmp_path)
    assert err.value.key == "model.parts"
    with pytest.raises(WorkflowError) as err:
        parse_workflow('[model]\ncomponent = "model:sum"\nparts = [1]\n' + STAGE, base=tmp_path)
    assert err.value.key == "model.parts[0]"


def test_a_table_part_without_its_component_is_refused_in_python_too():
    with pytest.raises(ConfigurationError, match="part 1 is a table without component"):
        registry.build("model:sum", parts=["model:demo", {"model": "model:d3"}])
