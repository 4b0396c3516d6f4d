"""COO edges for message-passing models: exactly ASE's ``ijS`` pairs within the cutoff, padding
that stays inert, updates without rebuilds, and capacity errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.neighborlist import neighbor_list

from alchemi_core.data import Batch
from alchemi_core.errors import CapacityError
from alchemi_potentials.neighbors import EdgeList

RC = 5.0


def systems(ref, rng):
    cu = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2)
    cu.rattle(0.1, seed=1)
    slab = ref.atoms(rng, 12, ref.cell(rng, (8.0, 9.0, 12.0), 0.3), (True, False, True), min_distance=2.0)
    slab.positions[:3, 1] -= 7.0  # below the cell on the open axis
    return [
        cu,
        ref.atoms(rng, 4, ref.cell(rng, (3.0, 3.5, 4.0), 0.3), True, min_distance=1.5),  # many images
        slab,
        ref.atoms(rng, 9, np.diag([8.0, 8.0, 8.0]), False, min_distance=2.0),  # a molecule in a box
    ]


def edge_set(edges, batch, first, n):
    count = int(edges.num_edges)
    i, j = edges.sender[:count].numpy(), edges.receiver[:count].numpy()
    s = edges.unit_shifts[:count].numpy()
    assert np.allclose(s, np.round(s)), "lattice shifts must be whole numbers"
    mine = (i >= first) & (i < first + n)
    assert ((j[mine] >= first) & (j[mine] < first + n)).all(), "an edge crosses systems"
    rows = zip(i[mine], j[mine], s[mine], strict=True)
    out = [(int(a) - first, int(b) - first, *map(int, np.round(v))) for a, b, v in rows]
    assert len(out) == len(set(out)), "an edge appears twice"
    return set(out)


def check_against_ase(edges, batch, atoms_list):
    ptr = np.concatenate(([0], np.cumsum(batch.num_nodes_per_system)))
    for s, atoms in enumerate(atoms_list):
        i, j, shifts = neighbor_list("ijS", atoms, RC)
        assert len(i) > 0
        want = {(int(a), int(b), *map(int, v)) for a, b, v in zip(i, j, shifts, strict=True)}
        assert edge_set(edges, batch, ptr[s], len(atoms)) == want, f"system {s}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_edges_are_ase_pairs_within_the_cutoff(ref, rng, dtype, tuning):
    atoms_list = systems(ref, rng)
    batch = ref.batch(atoms_list, dtype=dtype)
    el = EdgeList(RC, skin=0.5, tuning=tuning)
    edges = el.update(batch)
    check_against_ase(edges, batch, atoms_list)
    vec = edges.vectors(batch.positions, batch.cell)
    count = int(edges.num_edges)
    assert (vec[:count].norm(dim=1) < RC).all()
    # padding: an atom to itself, vector exactly (cutoff, 0, 0)
    assert edges.capacity > count
    assert (edges.sender[count:] == edges.receiver[count:]).all()
    assert torch.equal(vec[count:], torch.tensor([RC, 0.0, 0.0], dtype=dtype).expand(edges.capacity - count, 3))
    # ... on every atom in turn (not all on one, whose row every scatter would then queue on), in its own system
    pad = edges.sender[count:]
    assert pad.unique().numel() == min(batch.num_nodes, edges.capacity - count)
    assert torch.equal(edges.system[count:], batch.batch_idx[pad])


def test_edges_follow_atoms_inside_the_skin_without_a_rebuild(ref, rng, tuning):
    atoms_list = systems(ref, rng)
    batch = ref.batch(atoms_list)
    el = EdgeList(RC, skin=1.0, tuning=tuning)
    el.update(batch)
    builds = el.neighbor_list.builds(batch).clone()
    capacity = el.capacity
    move_and_check(el, batch, atoms_list, steps=3, scale=0.08, largest=0.15, seed=3)
    assert torch.equal(el.neighbor_list.builds(batch), builds), "moves within skin/2 must not rebuild"
    assert el.capacity == capacity


def test_edges_stay_exact_when_systems_rebuild_in_cohorts(ref, rng):
    """A GPU's lists rebuild in cohorts (join_fraction 0.8 there); here on the CPU at 0.5,
    against 1.0 on the same moves: systems join others' rebuilds (more builds), and the edges
    equal ASE's at every step either way."""
    import attrs

    from alchemi_potentials.tuning import PotentialsTuning

    atoms_list = systems(ref, rng)
    start = [a.positions.copy() for a in atoms_list]
    builds = {}
    for join in (1.0, 0.5):
        tuning = attrs.evolve(PotentialsTuning.for_device("cpu"), join_fraction=join)
        for a, x in zip(atoms_list, start, strict=True):
            a.positions = x.copy()
        batch = ref.batch(atoms_list)
        el = EdgeList(RC, skin=1.0, tuning=tuning)
        el.update(batch)
        move_and_check(el, batch, atoms_list, steps=6, scale=0.12, largest=0.2, seed=5)
        builds[join] = el.neighbor_list.builds(batch).clone()
    assert (builds[0.5] >= builds[1.0]).all() and builds[0.5].sum() > builds[1.0].sum(), builds


def move_and_check(el, batch, atoms_list, steps: int, scale: float, largest: float, seed: int) -> None:
    """Move every atom by a clipped normal step (Å) ``steps`` times; after each, the edge list
    must equal ASE's for the moved structures."""
    g = np.random.default_rng(seed)
    for _ in range(steps):
        step = g.normal(scale=scale, size=(batch.num_nodes, 3)).clip(-largest, largest)
        batch.positions.add_(torch.as_tensor(step))
        for a, lo, hi in zip(atoms_list, *_bounds(batch), strict=True):
            a.positions = batch.positions[lo:hi].numpy()
        check_against_ase(el.update(batch), batch, atoms_list)


def _bounds(batch):
    ptr = np.concatenate(([0], np.cumsum(batch.num_nodes_per_system)))
    return ptr[:-1], ptr[1:]


def test_fixed_capacity_overflow_is_an_error(ref, rng, tuning):
    atoms_list = systems(ref, rng)
    batch = ref.batch(atoms_list)
    el = EdgeList(RC, skin=0.5, max_edges=100, tuning=tuning)
    edges = el.update(batch)
    assert edges.capacity == 100
    assert bool(el.error_flag(batch))
    with pytest.raises(CapacityError, match="max_edges="):
        el.verify(batch)
    roomy = EdgeList(RC, skin=0.5, tuning=tuning)
    roomy.update(batch)
    assert not bool(roomy.error_flag(batch))


def test_one_system_alone_has_the_edges_it_has_in_a_batch(ref, rng, tuning):
    atoms_list = systems(ref, rng)
    alone = Batch.from_atoms([atoms_list[0]], dtype=torch.float64)
    edges = EdgeList(RC, tuning=tuning).update(alone)
    check_against_ase(edges, alone, atoms_list[:1])
