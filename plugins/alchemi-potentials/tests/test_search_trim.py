"""The search that skips the bins of a slot's box lying wholly beyond the list radius
(``PotentialsTuning.search_trim``) writes the same entries, in the same order, as the search of the whole
box: orthogonal cells (gaps added as squares) and triclinic ones (each gap alone), partly
periodic and open systems (hashed axes), cells thinner than the cutoff (the box wraps the grid),
atoms on bin planes, half and full lists, float32 and float64, on the CPU and a GPU (whose
default is the whole box)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch
from ase.build import bulk

from alchemi_potentials.neighbors import BatchedNeighborList
from alchemi_potentials.tuning import PotentialsTuning

RC = 7.0


def systems(ref, rng):
    crystal = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3)  # atoms on bin planes
    crystal.rattle(1e-7, seed=1)
    return [
        ref.atoms(rng, 30, ref.cell(rng, (10.0, 11.0, 10.5), 0.3), True, min_distance=2.2),
        ref.atoms(rng, 40, np.diag([14.0, 13.0, 15.0]), True, min_distance=2.2),
        ref.atoms(rng, 13, ref.cell(rng, (9.0, 9.5, 12.0), 0.2), (True, False, True)),
        ref.atoms(rng, 4, ref.cell(rng, (4.0, 4.5, 5.0), 0.2), True, min_distance=2.5),
        ref.atoms(rng, 11, np.diag([9.0, 9.0, 9.0]), False),
        ref.atoms(rng, 40, np.diag([14.0, 13.0, 25.0]), (False, True, True)),
        crystal,
    ]


def rows(nl, batch):
    """Each slot's entries, in order, and the slot -> atom map (a CPU's build is deterministic)."""
    m = nl.update(batch)
    entries, count = m.entries.cpu().numpy(), m.count.cpu().numpy()
    if entries.shape[0] != count.shape[0]:  # [columns, slots]
        entries = entries.T
    return [entries[t, : count[t]].tolist() for t in range(count.shape[0])], m.order.cpu().numpy().tolist()


def pair_set(nl, batch):
    """The listed pairs as sorted rows ``(i, j, shift)``, each pair of a half list with its lower atom
    first. A GPU fills its bins with atomic adds, so the order of atoms within a bin, the slot
    order, and the end of a pair a half list keeps all vary between builds; the pairs do not."""
    nl.update(batch)
    i, j, shift = nl.pairs(batch)
    flip = (i > j) | ((i == j) & (np.sign(shift) @ np.array([9, 3, 1]) < 0))
    if not nl.half_list:
        flip[:] = False
    i, j, shift = np.where(flip, j, i), np.where(flip, i, j), np.where(flip[:, None], -shift, shift)
    return sorted(zip(i.tolist(), j.tolist(), map(tuple, shift.tolist())))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("half", [False, True], ids=["full", "half"])
@pytest.mark.parametrize("skin", [0.0, 0.5])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_trimmed_search_writes_the_entries_of_the_whole_box(ref, rng, half, dtype, skin, device):
    structures = systems(ref, rng)
    found = {}
    for trim in (True, False):
        tuning = attrs.evolve(PotentialsTuning.for_device(device), search_trim=trim)
        read = rows if device == "cpu" else pair_set
        found[trim] = read(BatchedNeighborList(RC, skin, half_list=half, tuning=tuning),
                           ref.batch(structures, dtype=dtype, device=device))
    assert sum(len(r) for r in found[False][0]) > 1000 if device == "cpu" else len(found[False]) > 1000
    assert found[True] == found[False]

