"""The CPU pair kernel with neighbours in SIMD lanes (``pair_lanes``) against the numpy reference
and against the Warp kernel it replaces, for every variant it covers: half and full lists, with
and without virials, totals added directly or per slot, float32 and float64, rows of every length
(so last blocks of every fill), cut in ranges on one thread or two."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch

from alchemi_potentials import LennardJones, pair_lanes, pair_potential
from alchemi_potentials.neighbors import BatchedNeighborList
from alchemi_potentials.pair_forces import PairOptions, pair_kernel
from alchemi_potentials.pair_kernels import MORSE
from alchemi_potentials.tuning import PotentialsTuning

RC = 7.0
EPS, SIG = 0.0104, 3.405


def systems(ref, rng):
    """One species; triclinic, partly periodic, open, and a cell thinner than the cutoff (images
    past the nearest): from a few neighbours per atom to about a hundred."""
    return [
        ref.atoms(rng, 18, ref.cell(rng, (10.0, 11.0, 10.5), 0.3), True, min_distance=2.5),
        ref.atoms(rng, 13, ref.cell(rng, (9.0, 9.5, 12.0), 0.2), (True, False, True)),
        ref.atoms(rng, 4, ref.cell(rng, (4.0, 4.5, 5.0), 0.2), True, min_distance=2.5),
        ref.atoms(rng, 11, np.diag([9.0, 9.0, 9.0]), False),
    ]


def cpu_tuning(**changes) -> PotentialsTuning:
    """A CPU's tuning with ``changes``."""
    return attrs.evolve(PotentialsTuning.for_device("cpu"), **changes)


def model(half: bool, skin: float = 0.5, shift: bool = False, tuning: PotentialsTuning | None = None) -> LennardJones:
    return LennardJones(EPS, SIG, RC, shift_energy=shift, tuning=tuning,
                        neighbor_list=BatchedNeighborList(RC, skin, half_list=half, tuning=tuning))


def evaluate(ref, structures, half, dtype=torch.float64, stress=True, lanes=True, shift=False, skin=0.5,
             order="rows"):
    """The model's forward with the lanes on or off, from a matrix in ``order``; checks which
    variant ran."""
    made = []

    def spy(options):
        made.append(options)
        return pair_kernel(options)

    m = model(half, skin, shift, cpu_tuning(lanes=lanes, matrix_order=order))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pair_potential, "pair_kernel", spy)
        out = m(ref.batch(structures, dtype=dtype), compute_stress=stress)
    assert [o.lanes for o in made] == [lanes]
    out["model"] = m
    return out


def check_against_reference(ref, structures, out, shift, rtol, stress=True):
    pair = ref.lennard_jones(lambda a, b: EPS, lambda a, b: SIG, RC, shift=shift)
    ptr = np.concatenate(([0], np.cumsum([len(a) for a in structures])))
    for s, atoms in enumerate(structures):
        e, f, w = ref.pairs(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc, RC, pair)
        assert abs(out["energy"][s, 0].item() - e) <= rtol * abs(e), f"system {s} energy"
        ref.close(out["forces"][ptr[s] : ptr[s + 1]], f, rtol=rtol, what=f"system {s} forces")
        if stress and atoms.pbc.all():
            ref.close(out["stress"][s], w / abs(np.linalg.det(atoms.cell.array)), rtol=rtol,
                      what=f"system {s} stress")


@pytest.mark.parametrize("per_slot", [False, True], ids=["direct", "per-slot"])
@pytest.mark.parametrize("stress", [False, True], ids=["energy-forces", "virial"])
@pytest.mark.parametrize("half", [False, True], ids=["full", "half"])
def test_lanes_give_the_reference_and_the_warp_kernel(ref, rng, monkeypatch, half, stress, per_slot):
    """The 1.5 Å skin puts many listed pairs past the cutoff, where the lanes mask."""
    if per_slot:
        monkeypatch.setattr(pair_potential, "DIRECT_TOTALS_UP_TO", 0)
        monkeypatch.setattr(pair_potential, "FOLD_CHUNK", 4)
    structures = systems(ref, rng)
    lanes = evaluate(ref, structures, half, stress=stress, skin=1.5, shift=True)
    check_against_reference(ref, structures, lanes, True, 1e-9, stress)
    warp = evaluate(ref, structures, half, stress=stress, skin=1.5, shift=True, lanes=False)
    for name in ("energy", "forces") + (("stress",) if stress else ()):
        torch.testing.assert_close(lanes[name], warp[name], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("order", ["rows", "columns"])
@pytest.mark.parametrize("half", [False, True], ids=["full", "half"])
def test_lanes_in_float32_from_either_matrix_order(ref, rng, half, order):
    """(A CPU's matrix holds each slot's entries contiguously, "rows": whole blocks load as one;
    "columns", a GPU's order, is read entry by entry.)"""
    structures = systems(ref, rng)
    out = evaluate(ref, structures, half, dtype=torch.float32, order=order)
    assert out["forces"].dtype == torch.float32
    check_against_reference(ref, structures, out, False, 2e-5)


def test_lanes_cover_one_species_lennard_jones_unswitched_only():
    assert pair_lanes.covers(PairOptions(half=True, virial=True, per_slot=True))
    assert not pair_lanes.covers(PairOptions(kind=MORSE))
    assert not pair_lanes.covers(PairOptions(one_type=False))
    assert not pair_lanes.covers(PairOptions(switching=True))
    with pytest.raises(AssertionError):
        PairOptions(kind=MORSE, lanes=True)


def test_several_species_keep_the_warp_kernel_with_the_lanes_on(ref, rng, monkeypatch):
    made = []
    monkeypatch.setattr(pair_potential, "pair_kernel", lambda options: made.append(options) or pair_kernel(options))
    structures = [ref.atoms(rng, 12, np.diag([9.0, 9.0, 9.0]), True, species=(18, 36))]
    LennardJones({18: EPS, 36: 0.0141}, {18: SIG, 36: 3.65}, RC)(ref.batch(structures))
    assert [o.lanes for o in made] == [False]


_WIDTH_SCRIPT = """
import sys
import attrs
import torch
from ase.build import bulk
from alchemi_core.data import Batch
from alchemi_potentials import LennardJones, pair_lanes
from alchemi_potentials.neighbors import BatchedNeighborList
from alchemi_potentials.tuning import PotentialsTuning

width = int(sys.argv[1])
cells = []
for seed, repeat in enumerate((1, 2, 3)):  # rows from a few to about 90 neighbours
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(repeat)
    atoms.rattle(0.1, seed=seed)
    cells.append(atoms)
batch = Batch.from_atoms(cells, dtype=torch.float64)
outs = []
for lanes in (True, False):
    tuning = attrs.evolve(PotentialsTuning.for_device("cpu"), lanes=lanes, lane_width=width, wide_lane_width=width)
    m = LennardJones(0.0104, 3.405, 7.0, neighbor_list=BatchedNeighborList(7.0, 1.5, half_list=True), tuning=tuning)
    outs.append(m(batch, compute_stress=True))
for name in ("energy", "forces", "stress"):
    torch.testing.assert_close(outs[0][name], outs[1][name], rtol=1e-12, atol=1e-15)
print("same", pair_lanes.row_function.cache_info().currsize)
"""


@pytest.mark.parametrize("width", [PotentialsTuning.for_device("cpu").lane_width,
                                   PotentialsTuning.for_device("cpu").wide_lane_width])
def test_both_block_widths_give_the_warp_kernel(width):
    """The block width is chosen when the snippet compiles (``__AVX512F__``), so a machine runs only
    one of them in-process: each width is forced in a fresh interpreter here."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _WIDTH_SCRIPT, str(width)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["same", "1"], done.stdout  # (an old Warp prints its warnings there)
