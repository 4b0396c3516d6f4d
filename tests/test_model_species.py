"""``BaseModel.check_batch``: atomic numbers against the card's species, looked up on the batch's
device; a batch with an unknown number is rejected naming every unknown number."""

from __future__ import annotations

import re

import pytest
import torch

from alchemi_core.errors import InvalidDataError
from alchemi_core.models import BaseModel, ModelCard
from alchemi_core.testing import make_batch
from alchemi_core.testing.fixtures import CPU_AND_GPU

DEVICES = CPU_AND_GPU


class _Knows(BaseModel):
    def __init__(self, species: tuple[int, ...]) -> None:
        super().__init__()
        self.card = ModelCard(name="knows", species=species)

    def forward(self, batch, compute_stress=False):  # pragma: no cover - never called here
        raise AssertionError


def _with_numbers(numbers: list[int], device: str):
    batch = make_batch([len(numbers)]).to(device)
    batch.atomic_numbers.copy_(torch.tensor(numbers))
    return batch


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("species", "numbers", "unknown"), [
    ((18,), [18, 18, 18], None),
    ((1, 8), [8, 1, 1], None),
    ((18,), [18, 36, 18, 54], [36, 54]),
    ((18,), [0, 18], [0]),
    ((0, 127), [127, 0], None),
    ((18,), [128, 18], [128]),  # beyond the lookup table: unknown unless the card lists it
    ((18, 300), [300, 18], None),
    ((18,), [-1, 18], [-1]),
])
def test_unknown_atomic_numbers_are_rejected_by_name(device, species, numbers, unknown):
    model, batch = _Knows(species), _with_numbers(numbers, device)
    if unknown is None:
        model.check_batch(batch)
        return
    if all(0 <= z <= 118 for z in unknown):
        expected = f"no parameters for atomic numbers {unknown}; it knows"
    else:  # no element at all: called unknown, not a gap in the model's parameters
        expected = f"atomic numbers {unknown} are unknown elements (elements are 1-118)"
    with pytest.raises(InvalidDataError, match=re.escape(expected)):
        model.check_batch(batch)


def test_a_card_without_species_takes_any_element_and_refuses_numbers_that_are_none():
    _Knows(None).check_batch(_with_numbers([1, 118, 0], "cpu"))  # type: ignore[arg-type]
    with pytest.raises(InvalidDataError, match=re.escape("atomic numbers [-5, 300] are unknown elements")):
        _Knows(None).check_batch(_with_numbers([1, 300, -5], "cpu"))  # type: ignore[arg-type]
