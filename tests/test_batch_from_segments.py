"""``Batch.from_segments`` rebuilds a batch from concatenated fields, as storage readers do."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.data import Batch
from alchemi_core.errors import InvalidDataError
from alchemi_core.testing.contracts import assert_same_systems
from alchemi_core.testing.factories import make_batch


def test_rebuilds_a_batch_with_every_dtype_and_level():
    original = make_batch([3, 1, 4], edges=True, extras=True)
    fields = {k: getattr(original, k).clone() for k in original.keys()}
    rebuilt = Batch.from_segments(
        fields, original.levels, original.num_nodes_per_system, original.num_edges_per_system
    )
    assert_same_systems(original, rebuilt)
    assert rebuilt.edge_ptr.tolist() == original.edge_ptr.tolist()
    # The rebuilt batch behaves like any other: selection shifts neighbour indices correctly.
    assert_same_systems(original.index_select([2, 0]), rebuilt.index_select([2, 0]))


def test_rejects_rows_that_do_not_match_the_level():
    with pytest.raises(InvalidDataError, match="positions"):
        Batch.from_segments(
            {"atomic_numbers": torch.tensor([1, 1]), "positions": torch.zeros(3, 3)},
            {"atomic_numbers": "node", "positions": "node"},
            num_nodes=[2],
        )
    with pytest.raises(InvalidDataError, match="no level"):
        Batch.from_segments({"atomic_numbers": torch.tensor([1])}, {}, num_nodes=[1])
