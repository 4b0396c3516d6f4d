"""The neighbour list's per-system and per-atom buffers: parts of a few allocations, each field
its own memory with its own initial value, the known rows written from the host."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("warp")

from alchemi_potentials.neighbors import kernels  # noqa: E402
from alchemi_potentials.neighbors.layout import _ATOM_FIELDS, _SYSTEM_FIELDS, _allocate  # noqa: E402


def test_every_field_starts_at_its_value_and_owns_its_memory():
    rows = 5
    known = {"bin_capacity": np.array([3, 4]), "num_atoms": np.array([7, 9]), "index_bits": np.array([5, 6])}
    tensors = _allocate(_SYSTEM_FIELDS, rows, torch.device("cpu"), kernels.SystemState(), known)
    assert set(tensors) == set(_SYSTEM_FIELDS)
    for name, (shape, dtype, _wtype, init) in _SYSTEM_FIELDS.items():
        t = tensors[name]
        assert t.shape == (rows, *shape) and t.dtype == dtype and t.is_contiguous(), name
        expected = torch.full((rows, *shape), init, dtype=dtype)
        if name in known:
            expected[:2] = torch.as_tensor(known[name], dtype=dtype)
        assert torch.equal(t, expected) or (math.isnan(init) and bool(t.isnan().all())), name
    # No two fields share an element: marking one leaves every other as it was.
    before = {name: t.clone() for name, t in tensors.items()}
    for name, t in tensors.items():
        t.fill_(77)
        for other, u in tensors.items():
            if other != name:
                assert torch.equal(u, before[other]) or bool(u.isnan().all() and before[other].isnan().all()), (name, other)
        t.copy_(before[name])


def test_the_kernels_struct_views_the_same_memory():
    state = kernels.AtomState()
    tensors = _allocate(_ATOM_FIELDS, 6, torch.device("cpu"), state)
    for name, t in tensors.items():
        view = getattr(state, name)
        assert view.ptr == t.data_ptr() and view.shape[0] == 6, name
    pointers = sorted(t.data_ptr() for t in tensors.values())
    assert len(set(pointers)) == len(pointers)
