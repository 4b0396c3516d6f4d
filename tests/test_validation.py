"""Careless settings and non-finite data fail when the run is built, with one error naming the
parameter, the value and the fix (findings 4 and 7 of issue 13)."""

from __future__ import annotations

import math

import pytest
import torch

from alchemi_core.data import AtomicData, Batch
from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import ConvergenceHook, DemoDynamics, HostMemory, SizeAwareSampler
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import make_batch, random_structures


def _data(**fields):
    return AtomicData(atomic_numbers=torch.tensor([1, 8]), positions=torch.tensor([[0.0, 0, 0], [1.0, 0, 0]]), **fields)


@pytest.mark.parametrize(
    "field, value",
    [
        ("velocities", torch.tensor([[0.0, math.nan, 0], [0, 0, 0]])),
        ("velocities", torch.tensor([[0.0, 0, math.inf], [0, 0, 0]])),
        ("atomic_masses", torch.tensor([1.0, math.nan])),
        ("atomic_masses", torch.tensor([1.0, 0.0])),
        ("atomic_masses", torch.tensor([-1.0, 16.0])),
    ],
)
def test_non_finite_velocities_and_bad_masses_are_refused(field, value):
    with pytest.raises(InvalidDataError, match=field):
        _data(**{field: value})
    batch = Batch.from_data_list([_data()])
    with pytest.raises(InvalidDataError, match=field):
        batch.set_field(field, value, "node")
    with pytest.raises(InvalidDataError, match=field):
        setattr(batch, field, value)


@pytest.mark.parametrize(
    "build, names",
    [
        (lambda: DemoDynamics(model=DemoModelWrapper(), n_steps=2.7, dt=0.5), ["n_steps", "2.7"]),
        (lambda: DemoDynamics(model=DemoModelWrapper(), n_steps=10, dt=math.nan), ["dt", "nan"]),
        (lambda: DemoDynamics(model=DemoModelWrapper(), n_steps=10, dt=0.5, refill_frequency=1.5),
         ["refill_frequency", "1.5"]),
        (lambda: HostMemory(capacity=1.5), ["capacity", "1.5"]),
        (lambda: HostMemory(capacity=-1), ["capacity", "-1"]),
        (lambda: ConvergenceHook.from_fmax(math.nan), ["threshold", "nan"]),
        (lambda: ConvergenceHook.from_fmax(-0.05), ["threshold", "-0.05"]),
        (lambda: ConvergenceHook(criteria=[{"key": "energy_change", "threshold": -1e-6}]), ["threshold", "-1e-06"]),
        (lambda: ConvergenceHook.from_fmax(0.05, frequency=2.5), ["frequency", "2.5"]),
        (lambda: SizeAwareSampler(ListDataset(random_structures([3, 4])), max_atoms=10.9), ["max_atoms", "10.9"]),
        (lambda: SizeAwareSampler(ListDataset(random_structures([3, 4])), max_atoms=20, max_batch_size=2.5),
         ["max_batch_size", "2.5"]),
    ],
)
def test_nonsense_settings_fail_with_the_parameter_and_value(build, names):
    with pytest.raises(ConfigurationError) as err:
        build()
    for name in names:
        assert name in str(err.value), str(err.value)


def test_a_threshold_on_a_field_that_can_be_negative_may_be_negative():
    hook = ConvergenceHook(criteria=[{"key": "energy", "threshold": -5.0}])
    assert hook.criteria[0].threshold == -5.0


def test_whole_floats_are_accepted_as_counts():
    assert DemoDynamics(model=DemoModelWrapper(), n_steps=10.0, dt=0.5).n_steps == 10
    assert HostMemory(capacity=3.0).capacity == 3


def test_duplicate_system_ids_in_a_batch_are_refused():
    batch = make_batch([2, 3, 2])
    batch.system_id.copy_(torch.tensor([0, 1, 1]))
    with pytest.raises(InvalidDataError, match=r"system_id.*\[1\]"):
        DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5).run(batch)


class _NoIdsUpFront(ListDataset):
    get_all_system_ids = None  # a dataset that cannot list its ids without loading them


def test_duplicate_system_ids_from_a_dataset_are_refused_when_they_arrive():
    data = random_structures([2, 3, 2, 3])
    for d, sid in zip(data, [0, 1, 2, 1], strict=False):
        d.system_id = torch.tensor([sid])
    sampler = SizeAwareSampler(_NoIdsUpFront(data), max_atoms=5, max_batch_size=2)
    stage = DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5, sampler=sampler, sinks=[HostMemory(None)])
    with pytest.raises(InvalidDataError, match=r"system_id.*\b1\b"):
        stage.run()


def test_duplicate_system_ids_in_a_dataset_are_refused_when_the_sampler_is_built():
    data = random_structures([2, 3, 2, 3])
    for d, sid in zip(data, [0, 7, 2, 7], strict=False):
        d.system_id = torch.tensor([sid])
    with pytest.raises(InvalidDataError, match=r"7 at structures \[1, 3\]"):
        SizeAwareSampler(ListDataset(data), max_atoms=5, max_batch_size=2)


def _sampled_stage(**conv):
    data = ListDataset(random_structures([3, 4, 3]))
    sampler = SizeAwareSampler(data, max_atoms=8, max_batch_size=2)
    return DemoDynamics(model=DemoModelWrapper(), n_steps=5, dt=0.5, sampler=sampler, sinks=[HostMemory(None)],
                        convergence_hook=ConvergenceHook.from_fmax(1e9, **conv))


def test_a_convergence_target_that_leads_nowhere_fails_at_once():
    """Finding 2: target_status=-7 under a sampler looped forever (85,000 steps, nothing written)."""
    with pytest.raises(ConfigurationError, match=r"target_status=-7 is neither a stage's status code \(\[0\]\)"):
        _sampled_stage(target_status=-7).run()
    with pytest.raises(ConfigurationError, match=r"source_status=3"):
        _sampled_stage(source_status=3).run()


def test_a_fused_entry_status_that_is_no_stage_fails_at_once():
    """Finding 2: FusedStage(..., entry_status=5) returned at once with no step and no error."""
    from alchemi_core.dynamics import FusedStage

    model = DemoModelWrapper()
    stages = [(0, DemoDynamics(model=model, n_steps=3, dt=0.5)), (1, DemoDynamics(model=model, n_steps=3, dt=0.5))]
    with pytest.raises(ConfigurationError, match=r"entry_status=5 is not a stage's status code \(\[0, 1\]\)"):
        FusedStage(stages, entry_status=5)
