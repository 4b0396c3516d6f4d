"""Evaluating an edge model in chunks of whole systems (``chunk_atoms``) gives the whole batch's
results, and each chunk's edge window holds exactly its systems' edges."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from alchemi_core.data import Batch
from alchemi_core.errors import CapacityError, ConfigurationError
from alchemi_core.models import check_input
from alchemi_potentials.edge_model import EdgeModel
from alchemi_potentials.neighbors import EdgeList
from alchemi_potentials.neighbors.chunks import SystemChunks, group_systems
from alchemi_potentials.neighbors.edges import Edges
from alchemi_potentials.testing import copper_cells, reference_structures

CUTOFF = 3.2


class TwoHop(EdgeModel):
    """A toy many-body potential with two rounds of message passing, so a chunk that lost or
    mislabelled one edge, or mixed two systems, changes energies beyond the first shell."""

    def energies(self, batch, positions, cell, edges):
        r = edges.vectors(positions, cell).norm(dim=1)
        fc = torch.where(r < CUTOFF, 0.5 * (torch.cos(math.pi * r / CUTOFF) + 1.0), torch.zeros_like(r))
        zero = torch.zeros(batch.num_nodes, dtype=r.dtype, device=r.device)
        species = batch.atomic_numbers.to(r.dtype) / 10.0
        rho = zero.index_add(0, edges.receiver, torch.exp(-r) * fc * species[edges.sender])
        second = zero.index_add(0, edges.receiver, torch.sqrt(rho + 0.1)[edges.sender] * fc)
        site = -torch.sqrt(rho + 0.1) + 0.05 * second**2
        return torch.zeros(batch.num_graphs, dtype=r.dtype, device=r.device).index_add(0, batch.batch_idx, site)


def mixed_batch(dtype=torch.float64) -> Batch:
    """Systems of 32, 108, 16, 5, 108 and 12 atoms: bulk, a molecule in a box and a slab."""
    cu, si, ch4, slab = reference_structures()
    return Batch.from_atoms([cu, *copper_cells(1), si, ch4, *copper_cells(2)[1:], slab], dtype=dtype)


def test_systems_are_grouped_in_order_and_never_split():
    assert group_systems(np.array([3, 3, 5, 2, 9]), 6) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert group_systems(np.array([9, 1, 1]), 2) == [(0, 1), (1, 3)]
    assert group_systems(np.array([2, 2, 2]), 6) == [(0, 3)]
    assert group_systems(np.array([], dtype=np.int64), 6) == []
    with pytest.raises(ConfigurationError, match="chunk_atoms"):
        SystemChunks(0, padding_length=CUTOFF)


@pytest.mark.parametrize("max_atoms", [1, 40, 150])
def test_each_window_holds_its_systems_edges_in_order(max_atoms):
    batch = mixed_batch()
    edges = EdgeList(CUTOFF).update(batch)
    assert_windows_hold_their_edges(batch, edges, SystemChunks(max_atoms, padding_length=CUTOFF).update(batch, edges))


def test_a_new_batch_in_the_last_ones_edge_buffers_is_planned_anew():
    """CUDA's caching allocator gives a new batch's edge list the blocks the last batch's list freed
    (the same addresses and capacity), and a new batch of the same structures has the same
    ``version``: the chunks must still be planned from the new batch's own edges. (W7's second run
    of 256 cells in chunks read its edges through the first run's offsets: a device-side assert.)"""
    planner = SystemChunks(216, padding_length=CUTOFF)
    first = Batch.from_atoms(copper_cells(4), dtype=torch.float64)
    old = EdgeList(CUTOFF, max_edges=8192).update(first)
    planner.update(first, old)
    second = Batch.from_atoms(copper_cells(4, rattle=0.25), dtype=torch.float64)  # other edges per atom
    assert second.version == first.version
    new = EdgeList(CUTOFF, max_edges=8192).update(second)
    assert new.ends is not None and old.ends is not None
    assert not torch.equal(new.ends, old.ends)
    # the new list's edges in the old list's blocks; its offsets (ends) in a buffer of its own, as the
    # old plan still refers to the old one
    in_old_blocks = Edges(old.index.copy_(new.index), old.unit_shifts.copy_(new.unit_shifts),
                          old.system.copy_(new.system), old.padding.copy_(new.padding), new.count, new.ends)
    assert_windows_hold_their_edges(second, in_old_blocks, planner.update(second, in_old_blocks))


def assert_windows_hold_their_edges(batch, edges, chunks):
    """Each chunk's window holds exactly its systems' edges of ``edges``, in order, then padding."""
    n = int(edges.num_edges)
    sender, receiver = edges.index[0, :n], edges.index[1, :n]
    assert sum(c.num_graphs for c in chunks) == batch.num_graphs
    for c in chunks:
        a0, a1 = c.first_atom, c.first_atom + c.num_nodes
        mine = (sender >= a0) & (sender < a1)
        m = int(c.edges.num_edges)
        assert m == int(mine.sum()) > 0
        torch.testing.assert_close(c.edges.index[:, :m] + a0, edges.index[:, :n][:, mine], rtol=0, atol=0)
        torch.testing.assert_close(c.edges.unit_shifts[:m], edges.unit_shifts[:n][mine], rtol=0, atol=0)
        torch.testing.assert_close(c.edges.system[:m] + c.first_system, edges.system[:n][mine], rtol=0, atol=0)
        assert bool((receiver[mine] >= a0).all() and (receiver[mine] < a1).all())
        # the rest pads: an atom of the chunk to itself, its own system, a vector of the padding length
        pad = slice(m, c.capacity)
        assert bool((c.edges.index[0, pad] == c.edges.index[1, pad]).all())
        assert bool((c.edges.index[0, pad] < c.num_nodes).all())
        torch.testing.assert_close(c.edges.system[pad], c.batch_idx[c.edges.index[0, pad]], rtol=0, atol=0)
        pos, cell = c.atoms(batch.positions), c.systems(batch.cell)
        lengths = c.edges.vectors(pos, cell).norm(dim=1)
        torch.testing.assert_close(lengths[pad], torch.full_like(lengths[pad], CUTOFF))
        assert float(lengths[:m].max()) < CUTOFF
        assert c.capacity >= m and c.capacity % 64 == 0
        torch.testing.assert_close(c.batch_ptr, batch.batch_ptr[c.first_system:c.first_system + c.num_graphs + 1] - a0,
                                   rtol=0, atol=0)


@pytest.mark.parametrize("chunk_atoms", [1, 40, 150, 10_000])
def test_chunked_results_equal_the_whole_batch(chunk_atoms):
    batch = mixed_batch()
    whole = TwoHop(cutoff=CUTOFF, name="two-hop")(batch, compute_stress=True)
    model = TwoHop(cutoff=CUTOFF, name="two-hop", chunk_atoms=chunk_atoms)
    assert model.chunk_atoms == chunk_atoms and model.chunking is not None
    for _ in range(2):  # planned at the first call, reused at the second
        out = model(batch, compute_stress=True)
        for key in ("energy", "forces", "stress"):
            assert out[key].shape == whole[key].shape
            torch.testing.assert_close(out[key], whole[key], rtol=0, atol=1e-12)
    assert float(whole["forces"].abs().max()) > 1e-3  # the comparison has something to compare
    assert model.error_flag(batch) is not None and not bool(model.error_flag(batch))
    model.verify(batch)


def test_chunked_langevin_run_follows_the_whole_one():
    from alchemi_core import registry

    def run(model):
        md = registry.build("integrator:langevin", model=model, n_steps=15, dt=1.0, temperature=300.0,
                            friction=0.01, initial_temperature=300.0, random_seed=3)
        with md:
            return md.run(mixed_batch())

    whole = run(TwoHop(cutoff=CUTOFF, name="two-hop"))
    chunked = run(TwoHop(cutoff=CUTOFF, name="two-hop", chunk_atoms=120))
    torch.testing.assert_close(chunked.positions, whole.positions, rtol=0, atol=1e-10)
    torch.testing.assert_close(chunked.forces, whole.forces, rtol=0, atol=1e-10)


def squeeze_the_middle_cell(batch: Batch) -> None:
    """Its atoms get half as many neighbours again (18 within the cutoff instead of 12), more
    than the 20 % its window keeps beyond the edges it had when the chunks were planned."""
    with torch.no_grad():
        batch.positions[108:216] *= 0.85
        batch.cell[1] *= 0.85


def test_a_window_that_overflows_is_reported_with_the_max_edges_that_fits():
    batch = Batch.from_atoms(copper_cells(3), dtype=torch.float64)
    model = TwoHop(cutoff=CUTOFF, name="two-hop", chunk_atoms=108)
    model(batch)
    model.verify(batch)
    squeeze_the_middle_cell(batch)
    model(batch)
    assert bool(model.error_flag(batch))
    with pytest.raises(CapacityError, match=r"systems 1-1 .*pass max_edges=\d+ .*chunk_atoms=None") as raised:
        model.verify(batch)
    model.edge_list.verify(batch)  # the edge list itself held them: the window is what overflowed
    advised = int(re.search(r"max_edges=(\d+)", str(raised.value)).group(1))
    # the value named fits: the same squeeze, planned with it, overflows nothing, and the results
    # are the whole batch's
    batch = Batch.from_atoms(copper_cells(3), dtype=torch.float64)
    model = TwoHop(cutoff=CUTOFF, name="two-hop", chunk_atoms=108, max_edges=advised)
    model(batch)
    squeeze_the_middle_cell(batch)
    out = model(batch)
    assert not bool(model.error_flag(batch))
    model.verify(batch)
    torch.testing.assert_close(out["forces"], TwoHop(cutoff=CUTOFF, name="two-hop")(batch)["forces"], rtol=0, atol=1e-12)


def test_an_edge_list_that_overflows_is_reported_not_read_past_its_capacity():
    """With fewer edges than the batch needs, edges past the edge list's capacity are dropped:
    the windows of later chunks must not copy another chunk's edges (atom indices out of their
    range: a device-side assert on a GPU), and the edge list's error names the max_edges to use."""
    batch = Batch.from_atoms(copper_cells(3), dtype=torch.float64)  # 1,296 edges a cell
    model = TwoHop(cutoff=CUTOFF, name="two-hop", max_edges=1600, chunk_atoms=108)
    with pytest.raises(CapacityError, match=r"max_edges=4666"):
        model(batch)  # a direct call reads its error back at once
    check_input(model, batch)  # a run's forwards read nothing back until the check verifies
    out = model(batch)
    assert bool(model.error_flag(batch))
    for c in model.chunking.chunks:
        assert bool((c.edges.index >= 0).all() and (c.edges.index < c.num_nodes).all())
        assert bool((c.edges.system >= 0).all() and (c.edges.system < c.num_graphs).all())
    assert bool(torch.isfinite(out["forces"]).all())
    with pytest.raises(CapacityError, match=r"edge list overflow: the batch needed 3888 edges .*max_edges=4666"):
        model.verify(batch)
