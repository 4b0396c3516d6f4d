"""Shared setup for the seed-document tests.

Each test runs one code block of the seed documents with ``nvalchemi`` replaced by
``alchemi_core`` and ``"cuda"`` by the test device, after defining the names the block takes
from earlier blocks (``model``, ``batch``, ``dataset``, ...), then asserts what the block should
achieve.
"""

from __future__ import annotations

import os

import pytest
import torch

from alchemi_core.data import AtomicData, Batch
from alchemi_core.data.datapipes import ListDataset

DEVICE = os.environ.get("ALCHEMI_TEST_DEVICE", "cpu")


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """Blocks write files (md_log.csv, *.zarr) into the working directory: keep them apart."""
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    yield tmp_path


@pytest.fixture
def device() -> str:
    return DEVICE


def _molecule(n: int, seed: int) -> AtomicData:
    g = torch.Generator().manual_seed(seed)
    return AtomicData(
        atomic_numbers=torch.randint(1, 9, (n,), generator=g),
        positions=torch.randn(n, 3, generator=g) * 1.2,
    )


def dimer_at_rest() -> AtomicData:
    """Two hydrogens at the demo model's equilibrium distance: converged from the start."""
    r0 = 0.5 + 0.2 * 1.0  # 0.5 + 0.1 * (sqrt(1) + sqrt(1))
    return AtomicData(atomic_numbers=torch.tensor([1, 1]), positions=torch.tensor([[0.0, 0, 0], [r0, 0, 0]]))


@pytest.fixture
def batch() -> Batch:
    """What the seed's 'Basic setup' block builds, plus a second, relaxed system."""
    data = AtomicData(atomic_numbers=torch.tensor([6, 8, 1], dtype=torch.long), positions=torch.randn(3, 3))
    b = Batch.from_data_list([data, dimer_at_rest()], device=DEVICE)
    return b


@pytest.fixture
def dataset() -> ListDataset:
    """A dataset with __len__, __getitem__ and get_metadata, as SizeAwareSampler needs."""
    sizes = torch.randint(2, 9, (120,), generator=torch.Generator().manual_seed(1)).tolist()
    return ListDataset([_molecule(n, i) for i, n in enumerate(sizes)], device=DEVICE)


@pytest.fixture(name="molecule")
def molecule_factory():
    """``molecule(n, seed)``: a random n-atom molecule."""
    return _molecule
