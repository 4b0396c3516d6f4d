"""A model called directly checks what a run checks, once per batch object, with the run's
messages; a run checks the systems that enter once and its steps check nothing; results of a
wrong shape stop a run naming the model and the shape expected."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import DemoDynamics, HostMemory, SizeAwareSampler
from alchemi_core.errors import InvalidDataError
from alchemi_core.models import ModelCard
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.testing import make_batch, random_structures


class Counting(DemoModelWrapper):
    """The demo model, knowing a few species and counting its checks and forwards."""

    card = ModelCard(name="counting", species=(1, 6, 7, 8))

    def __init__(self) -> None:
        super().__init__()
        self.checks = 0
        self.forwards = 0

    def check_batch(self, batch):
        self.checks += 1
        super().check_batch(batch)

    def forward(self, batch, compute_stress=False):
        self.forwards += 1
        return super().forward(batch, compute_stress)


def _numbers(batch, numbers):
    batch.atomic_numbers.copy_(torch.tensor(numbers))
    return batch


def test_a_direct_call_refuses_species_the_model_lacks_with_the_runs_message():
    model = Counting()
    batch = _numbers(make_batch([3]), [1, 9, 6])
    with pytest.raises(InvalidDataError, match=r"model 'counting' has no parameters for atomic numbers \[9\]"):
        model(batch)
    with pytest.raises(InvalidDataError, match=r"model 'counting' has no parameters for atomic numbers \[9\]"):
        DemoDynamics(model=Counting(), n_steps=1, dt=0.5).run(_numbers(make_batch([3]), [1, 9, 6]))
    assert model.forwards == 0


def test_an_atomic_number_that_is_no_element_is_called_unknown_in_a_run_and_a_direct_call():
    batch = _numbers(make_batch([2]), [1, 119])
    with pytest.raises(InvalidDataError, match=r"atomic numbers \[119\] are unknown elements \(elements are 1-118\)"):
        DemoModelWrapper()(batch)  # a model that takes any element
    with pytest.raises(InvalidDataError, match=r"atomic numbers \[119\] are unknown elements"):
        DemoDynamics(model=DemoModelWrapper(), n_steps=1, dt=0.5).run(_numbers(make_batch([2]), [1, 119]))
    with pytest.raises(InvalidDataError, match=r"atomic numbers \[-3\] are unknown elements"):
        DemoDynamics(model=DemoModelWrapper(), n_steps=1, dt=0.5).run(_numbers(make_batch([2]), [-3, 1]))
    # An element without a tabulated mass is still an element, and says what to give.
    with pytest.raises(InvalidDataError, match="atomic number 100 has no tabulated mass"):
        DemoDynamics(model=DemoModelWrapper(), n_steps=1, dt=0.5).run(_numbers(make_batch([2]), [100, 1]))


def test_a_direct_call_checks_each_batch_object_once_and_again_after_a_failed_check():
    model = Counting()
    batch = _numbers(make_batch([2, 3]), [1, 6, 7, 8, 1])
    model(batch)
    model(batch)
    assert (model.checks, model.forwards) == (1, 2)
    model(_numbers(make_batch([2]), [1, 1]))
    assert model.checks == 2  # a new batch object is checked
    bad = _numbers(make_batch([2]), [1, 9])
    for _ in range(2):
        with pytest.raises(InvalidDataError):
            model(bad)
    assert model.checks == 4 and model.forwards == 3  # refused each time, never evaluated


def test_a_run_checks_what_enters_once_and_its_steps_check_nothing():
    model = Counting()
    structures = random_structures([4] * 12)
    for s in structures:
        s.atomic_numbers.copy_(torch.tensor([1, 6, 7, 8]))
    sampler = SizeAwareSampler(ListDataset(structures), max_atoms=16, bin_width=2)
    sink = HostMemory(capacity=None)
    DemoDynamics(model=model, n_steps=4, dt=0.5, sampler=sampler, refill_frequency=2, sinks=[sink]).run()
    assert len(sink) == 12
    # The first batch (4 structures) and each refill are checked once; no step checks.
    assert model.forwards > model.checks
    assert model.checks == 1 + 2  # 4 + 4 + 4 structures: the first batch and two refills


class Misshapen(DemoModelWrapper):
    """The demo model returning one of its results in another shape."""

    card = ModelCard(name="misshapen")

    def __init__(self, bend) -> None:
        super().__init__()
        self.bend = bend

    def forward(self, batch, compute_stress=False):
        out = dict(super().forward(batch, compute_stress))
        return self.bend(out)


@pytest.mark.parametrize(("bend", "message"), [
    (lambda out: {**out, "forces": out["forces"][0]}, r"forces of shape \[3\] .*must return forces of shape \[5, 3\]"),
    (lambda out: {**out, "forces": out["forces"][:-1]}, r"forces of shape \[4, 3\] .*must return forces of shape \[5, 3\]"),
    (lambda out: {**out, "energy": out["energy"].repeat(1, 2)}, r"energy of shape \[2, 2\] .*must return energy of shape \[2, 1\]"),
])
def test_results_of_a_wrong_shape_stop_a_run_naming_the_model_and_the_shape_expected(bend, message):
    batch = make_batch([2, 3])
    with pytest.raises(InvalidDataError, match=rf"model 'misshapen' returned {message}"):
        DemoDynamics(model=Misshapen(bend), n_steps=2, dt=0.5).run(batch)


def test_the_demo_model_pickles_after_a_call() -> None:
    """Its pair-table cache holds a weak reference to the last batch, which pickle cannot take:
    a model handed to worker processes is pickled after it has been called."""
    import pickle

    from alchemi_core.data import Batch
    from alchemi_core.models.demo import DemoModelWrapper
    from alchemi_core.testing import random_structures

    model = DemoModelWrapper()
    batch = Batch.from_data_list(random_structures([3, 4]))
    energy = model(batch)["energy"]
    again = pickle.loads(pickle.dumps(model))
    assert torch.equal(again(batch)["energy"], energy)
