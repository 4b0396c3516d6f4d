"""The batched cell list: the pairs it finds, when it rebuilds, and that systems stay apart."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.neighborlist import neighbor_list

from alchemi_core.data import Batch
from alchemi_core.errors import CapacityError, ConfigurationError, InvalidDataError
from alchemi_core.models import check_input
from alchemi_potentials import LennardJones
from alchemi_potentials.neighbors import BatchedNeighborList
from alchemi_potentials.tuning import PotentialsTuning

RC = 6.0


def some_systems(ref, rng):
    fcc = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2)
    fcc.rattle(0.1, seed=1)
    slab = ref.atoms(rng, 12, ref.cell(rng, (8.0, 9.0, 12.0), 0.3), (True, False, True), min_distance=2.0)
    slab.positions[:3, 1] -= 7.0  # below the cell on the open axis
    return [
        fcc,
        ref.atoms(rng, 4, ref.cell(rng, (3.0, 3.5, 4.0), 0.3), True, min_distance=1.5),  # many images
        slab,
        ref.atoms(rng, 10, ref.cell(rng, (7.0, 8.0, 7.5), 0.3), True, min_distance=2.0, outside=4),
        ref.atoms(rng, 9, np.diag([8.0, 8.0, 8.0]), False, min_distance=2.0),
    ]


def pair_set(i, j, shifts):
    return {(int(a), int(b), *map(int, s)) for a, b, s in zip(i, j, shifts)}


def listed_pairs(nl, batch, first: int, n: int):
    """(i, j, shift) of atoms first..first+n-1 as local indices."""
    i, j, shifts = nl.pairs(batch)
    mine = (i >= first) & (i < first + n)
    assert ((j[mine] >= first) & (j[mine] < first + n)).all(), "a pair crosses systems"
    return pair_set(i[mine] - first, j[mine] - first, shifts[mine])


@pytest.mark.parametrize("half", [False, True], ids=["full", "half"])
def test_pairs_equal_ase_neighbor_list_with_shifts(ref, rng, half, tuning):
    systems = some_systems(ref, rng)
    nl = BatchedNeighborList(cutoff=RC, skin=0.4, half_list=half, tuning=tuning)
    batch = ref.batch(systems)
    matrix = nl.update(batch)
    assert matrix.half is half
    ptr = np.concatenate(([0], np.cumsum(batch.num_nodes_per_system)))
    for s, atoms in enumerate(systems):
        i, j, shifts = neighbor_list("ijS", atoms, nl.radius)
        assert len(i) > 0
        listed = listed_pairs(nl, batch, ptr[s], len(atoms))
        if half:  # each pair once: with its mirror image, exactly ASE's full list
            mirrored = {(b, a, -x, -y, -z) for a, b, x, y, z in listed}
            assert not listed & mirrored, f"system {s} lists a pair twice"
            listed |= mirrored
        assert listed == pair_set(i, j, shifts), f"system {s}"


@pytest.mark.parametrize("half", [False, True], ids=["full", "half"])
def test_open_axes_hash_far_flung_atoms_exactly(ref, rng, half, tuning):
    """Open axes have no extent to cut into bins: their bins are hashed, so clusters hundreds of
    Å apart, a lone atom 10^4 Å out and a slab's atoms spread along its normal share bins; the
    distance test keeps exactly ASE's pairs."""
    import ase

    cluster = ref.atoms(rng, 14, np.diag([8.0, 8.0, 8.0]), False, min_distance=2.0)
    far = cluster.copy()
    far.positions += [480.0, -35.0, 220.0]
    lone = ase.Atoms("Ar2", positions=[[1.0e4, 2.0, -3.0], [1.0e4 + 3.1, 2.0, -3.0]])
    gas = cluster + far + lone
    gas.cell, gas.pbc = np.zeros((3, 3)), False
    slab = ref.atoms(rng, 16, ref.cell(rng, (9.0, 9.5, 6.0), 0.2), (True, True, False), min_distance=2.0)
    slab.positions[::3] += 37.0 * np.cross(slab.cell[0], slab.cell[1]) / np.linalg.norm(np.cross(slab.cell[0], slab.cell[1]))
    wire = ref.atoms(rng, 12, ref.cell(rng, (6.0, 6.0, 7.0), 0.0), (False, False, True), min_distance=2.0)
    wire.positions[:4, 0] -= 150.0
    structures = [gas, slab, wire]
    nl = BatchedNeighborList(cutoff=RC, skin=0.4, half_list=half, tuning=tuning)
    batch = ref.batch(structures)
    nl.update(batch)
    ptr = np.concatenate(([0], np.cumsum(batch.num_nodes_per_system)))
    for s, atoms in enumerate(structures):
        i, j, shifts = neighbor_list("ijS", atoms, nl.radius)
        listed = listed_pairs(nl, batch, ptr[s], len(atoms))
        if half:
            listed |= {(b, a, -x, -y, -z) for a, b, x, y, z in listed}
        assert listed == pair_set(i, j, shifts), f"system {s}"
    assert len(neighbor_list("i", gas, nl.radius)) > 0


def test_rebuilds_exactly_when_an_atom_moves_beyond_half_the_skin(ref, rng, tuning):
    systems = some_systems(ref, rng)[:3]
    batch = ref.batch(systems)
    nl = BatchedNeighborList(cutoff=RC, skin=1.0, tuning=tuning)
    nl.update(batch)
    assert nl.builds(batch).tolist() == [1, 1, 1]
    atom = int(batch.batch_ptr[1]) + 2  # an atom of system 1
    start = batch.positions[atom].clone()
    direction = torch.tensor([0.6, 0.0, 0.8], dtype=torch.float64)
    for distance, expected in [(0.3, [1, 1, 1]), (0.499, [1, 1, 1]), (0.501, [1, 2, 1]), (0.6, [1, 2, 1])]:
        batch.positions[atom] = start + distance * direction
        nl.update(batch)
        assert nl.builds(batch).tolist() == expected, distance
    # The reference moved with the rebuild: 0.45 further from there is still inside the skin.
    batch.positions[atom] = start + (0.501 + 0.45) * direction
    nl.update(batch)
    assert nl.builds(batch).tolist() == [1, 2, 1]
    # A changed periodic cell rebuilds that system only; so does changed periodicity.
    batch.cell[2] *= 1.0 + 1e-9
    nl.update(batch)
    assert nl.builds(batch).tolist() == [1, 2, 2]
    batch.pbc[0, 2] = False
    nl.update(batch)
    assert nl.builds(batch).tolist() == [2, 2, 2]


def test_a_list_without_a_skin_takes_its_tunings(ref, rng, tuning):
    """skin=None reads the tuning's skin: pairs out to cutoff + that skin (ASE's), a rebuild past
    half of it, and ``radius`` that of the device of the last build."""
    systems = some_systems(ref, rng)[:2]
    batch = ref.batch(systems)
    device = batch.positions.device.type
    default = BatchedNeighborList(cutoff=RC, tuning=tuning)
    assert default.skin_on(device) == PotentialsTuning.for_device(device).skin
    # No build yet: the largest any device uses.
    assert default.radius == RC + max(PotentialsTuning.for_device(d).skin for d in ("cpu", "cuda"))
    nl = BatchedNeighborList(cutoff=RC, half_list=False,
                             tuning=attrs.evolve(PotentialsTuning.for_device(device), skin=0.7))
    assert nl.skin is None and nl.skin_on(device) == 0.7 and "skin=by device" in repr(nl)
    assert nl.radius == RC + 0.7
    nl.update(batch)
    assert nl.radius == nl.radius_on(device) == RC + 0.7
    i, j, shifts = neighbor_list("ijS", systems[0], RC + 0.7)
    assert listed_pairs(nl, batch, 0, len(systems[0])) == pair_set(i, j, shifts)
    atom = int(batch.batch_ptr[1]) + 1
    start = batch.positions[atom].clone()
    for distance, expected in [(0.34, [1, 1]), (0.36, [1, 2])]:
        batch.positions[atom] = start + torch.tensor([distance, 0.0, 0.0], dtype=start.dtype)
        nl.update(batch)
        assert nl.builds(batch).tolist() == expected, distance
    assert BatchedNeighborList(RC, 0.2, tuning=tuning).skin_on(device) == 0.2  # a given skin holds everywhere
    with pytest.raises(ConfigurationError, match="skin >= 0"):
        BatchedNeighborList(RC, -0.1, tuning=tuning)


@pytest.mark.parametrize(("join", "expected"), [(0.8, [2, 2, 1]), (1.0, [1, 2, 1])])
def test_a_system_near_its_threshold_joins_another_systems_rebuild(ref, rng, join, expected, tuning):
    """skin/2 = 0.5: with join_fraction 0.8 a system whose atom moved 0.45 rebuilds only when
    another system must (one moved 0.51); one that moved 0.3 never joins; the batch's flag does
    not outlive its step."""
    batch = ref.batch(some_systems(ref, rng)[:3])
    nl = BatchedNeighborList(cutoff=RC, skin=1.0, join_fraction=join, tuning=tuning)
    nl.update(batch)
    direction = torch.tensor([0.0, 0.6, 0.8], dtype=torch.float64)
    atoms = [int(batch.batch_ptr[s]) + 1 for s in range(3)]
    start = batch.positions[atoms].clone()
    for s, distance in ((0, 0.45), (2, 0.3)):
        batch.positions[atoms[s]] = start[s] + distance * direction
        nl.update(batch)
        assert nl.builds(batch).tolist() == [1, 1, 1], f"system {s} rebuilt alone at {distance}"
    batch.positions[atoms[1]] = start[1] + 0.51 * direction
    nl.update(batch)
    assert nl.builds(batch).tolist() == expected
    batch.positions[atoms[2]] = start[2] + 0.45 * direction  # near, in a step where nothing must
    nl.update(batch)
    assert nl.builds(batch).tolist() == expected


@pytest.mark.parametrize("join_fraction", [0.0, -0.5, 1.5, float("nan")])
def test_join_fraction_outside_zero_to_one_is_refused(join_fraction, tuning):
    with pytest.raises(ConfigurationError, match="join_fraction in \\(0, 1\\]"):
        BatchedNeighborList(RC, 0.5, join_fraction=join_fraction, tuning=tuning)


@pytest.mark.parametrize("join", [None, 0.5], ids=["join-default", "join-0.5"])
@pytest.mark.parametrize("half", [True, False], ids=["half", "full"])
def test_kept_list_gives_the_same_forces_as_a_fresh_build(ref, rng, half, join, tuning):
    systems = some_systems(ref, rng)
    batch = ref.batch(systems)
    nl = BatchedNeighborList(RC, 0.8, half_list=half, join_fraction=join, tuning=tuning)
    model = LennardJones(0.01, 2.3, RC, neighbor_list=nl, tuning=tuning)
    g = torch.Generator().manual_seed(7)
    for step in range(25):
        batch.positions.add_(0.04 * torch.randn(batch.positions.shape, generator=g, dtype=torch.float64))
        out = model(batch, compute_stress=True)
        fresh = LennardJones(0.01, 2.3, RC, skin=0.0, tuning=tuning)(ref.batch(batch.to_atoms()), compute_stress=True)
        for key in ("energy", "forces", "stress"):
            torch.testing.assert_close(out[key], fresh[key], rtol=1e-10, atol=1e-12, msg=f"{key} step {step}")
    builds = model.neighbor_list.builds(batch)
    assert (builds > 1).any() and (builds < 26).all()  # rebuilt sometimes, not every step


@pytest.mark.parametrize("half", [True, False], ids=["half", "full"])
def test_kept_list_follows_a_deforming_cell(ref, rng, half, tuning):
    """Cells strained a little every step (atoms with them, plus thermal-like moves) give the
    forces, energies and stress of a fresh build, while fully periodic systems rebuild only when
    the accumulated deformation and displacements exceed what the skin covers."""
    systems = some_systems(ref, rng)
    batch = ref.batch(systems)
    model = LennardJones(0.01, 2.3, RC, neighbor_list=BatchedNeighborList(RC, 0.8, half_list=half, tuning=tuning), tuning=tuning)
    g = torch.Generator().manual_seed(8)
    ptr = batch.batch_ptr.tolist()
    eye = torch.eye(3, dtype=torch.float64)
    steps = 25
    for step in range(steps):
        for s in range(batch.num_graphs):
            e = 0.003 * torch.randn(3, 3, generator=g, dtype=torch.float64)
            strain = 1.004 * eye + 0.5 * (e + e.T)  # growing by ~10 % over the run, in all directions
            batch.positions[ptr[s] : ptr[s + 1]] = batch.positions[ptr[s] : ptr[s + 1]] @ strain
            batch.cell[s] = batch.cell[s] @ strain
        batch.positions.add_(0.01 * torch.randn(batch.positions.shape, generator=g, dtype=torch.float64))
        out = model(batch, compute_stress=True)
        fresh = LennardJones(0.01, 2.3, RC, skin=0.0, tuning=tuning)(ref.batch(batch.to_atoms()), compute_stress=True)
        for key in ("energy", "forces", "stress"):
            torch.testing.assert_close(out[key], fresh[key], rtol=1e-10, atol=1e-12, msg=f"{key} step {step}")
    builds = model.neighbor_list.builds(batch)
    periodic = builds[[0, 1, 3]]
    assert (periodic > 1).all() and (periodic < steps // 2).all(), builds.tolist()
    assert builds[2].item() == steps  # the slab (an open axis) rebuilds whenever its cell changes


def test_systems_do_not_depend_on_their_batch_mates(ref, rng, tuning):
    systems = some_systems(ref, rng)
    model = LennardJones(0.01, 2.3, RC, tuning=tuning)
    alone = [model(ref.batch([a]), compute_stress=True) for a in systems]
    order = [3, 0, 4, 2, 1]
    together = model(ref.batch([systems[k] for k in order]), compute_stress=True)
    counts = [len(systems[k]) for k in order]
    ptr = np.concatenate(([0], np.cumsum(counts)))
    for pos, k in enumerate(order):
        torch.testing.assert_close(together["energy"][pos], alone[k]["energy"][0], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(together["forces"][ptr[pos] : ptr[pos + 1]], alone[k]["forces"], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(together["stress"][pos], alone[k]["stress"][0], rtol=1e-12, atol=1e-14)


def test_buffers_follow_the_set_of_systems(ref, rng, tuning):
    """A pre-allocated batch that gains and loses systems: every version gives fresh results."""
    systems = some_systems(ref, rng)
    source = ref.batch(systems)
    buf = Batch.empty(num_systems=8, num_nodes=200, num_edges=0, template=source)
    model = LennardJones(0.01, 2.3, RC, tuning=tuning)
    buf.put(source, torch.tensor([True, False, True, True, False]))
    first = model(buf)
    expected = model(ref.batch([systems[0], systems[2], systems[3]]))
    torch.testing.assert_close(first["forces"], expected["forces"])
    buf.defrag(torch.tensor([False, True, False]))  # drop the slab
    buf.put(source, torch.tensor([False, True, False, False, True]))
    again = model(buf)
    expected = model(ref.batch([systems[0], systems[3], systems[1], systems[4]]))
    torch.testing.assert_close(again["energy"], expected["energy"])
    torch.testing.assert_close(again["forces"], expected["forces"])


def test_fixed_columns_overflow_is_reported_not_hidden(ref, tuning):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3)
    batch = ref.batch([atoms])
    model = LennardJones(0.0104, 3.405, 8.5125, max_neighbors=40, tuning=tuning)
    # The first direct call of a batch checks what it found on the device, and says what to pass.
    with pytest.raises(CapacityError, match=r"max_neighbors is 40, so pairs were dropped.*pass max_neighbors=\d+"):
        model(batch)
    with pytest.raises(CapacityError, match="max_neighbors is 40"):
        model(batch)  # and again: a failed check does not mark the batch as checked
    engine_batch = ref.batch([atoms])
    check_input(model, engine_batch)  # what the engine does: check, then forwards that never read back ...
    model(engine_batch)
    with pytest.raises(CapacityError, match="overflow.*forces are wrong"):
        model.verify(engine_batch)  # ... until it verifies
    assert bool(model.error_flag(engine_batch))  # what a check reads instead of verifying
    roomy = LennardJones(0.0104, 3.405, 8.5125, max_neighbors=120, tuning=tuning)
    assert roomy.error_flag(batch) is None  # nothing built yet
    roomy.check_batch(batch)
    roomy(batch)
    roomy.verify(batch)
    assert not bool(roomy.error_flag(batch))


@pytest.mark.parametrize("record", ["bad_cell", "overflow", "image_out_of_range", "far_atoms"])
def test_the_error_flag_is_set_exactly_when_verify_has_something_to_raise(record, tuning):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3)
    batch = Batch.from_atoms([atoms, atoms])
    nl = BatchedNeighborList(cutoff=8.5125, skin=0.5, tuning=tuning)
    nl.update(batch)
    assert not bool(nl.error_flag(batch))
    nl.verify(batch)
    nl._layout.system_tensors[record][1] = 200  # what a kernel records for the second system
    assert bool(nl.error_flag(batch))
    with pytest.raises((CapacityError, InvalidDataError)):
        nl.verify(batch)


def test_overflow_names_the_exact_need(tuning):
    """The count the error suggests is the true most-neighbours, also where the recorded one
    fell short."""
    import re

    cells = [bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3) for _ in range(48)]
    for i, a in enumerate(cells):
        a.rattle(0.1, seed=i)
    batch = Batch.from_atoms(cells)
    sized = BatchedNeighborList(cutoff=8.5125, skin=0.5, tuning=tuning)
    sized.update(batch)
    exact = int(sized.most_neighbors(batch).max())
    tight = BatchedNeighborList(cutoff=8.5125, skin=0.5, max_neighbors=exact // 2, tuning=tuning)
    tight.update(batch)
    for recorded in ("as searched", "one past the columns"):
        if recorded != "as searched":  # what a lost update between two ranges leaves behind
            overflow = tight._layout.system_tensors["overflow"]
            overflow.copy_(torch.where(overflow > 0, exact // 2 + 1, 0))
        with pytest.raises(CapacityError) as err:
            tight.verify(batch)
        assert int(re.search(r"had up to (\d+) neighbours", str(err.value)).group(1)) == exact, recorded


def test_a_refill_that_needs_more_columns_stops_the_run_before_it_steps(tuning):
    """A structure that enters by refill with more neighbours than a fixed ``max_neighbors``
    allows raises at the refill (after its first forward, before any step uses it), naming it;
    what graduated before is in the sink."""
    from alchemi_core.data import AtomicData
    from alchemi_core.data.datapipes import ListDataset
    from alchemi_core.dynamics import DemoDynamics, HostMemory, SizeAwareSampler

    loose, dense = (bulk("Ar", "fcc", a=a, cubic=True).repeat(3) for a in (5.26, 4.4))
    most = {}
    half = LennardJones(0.0104, 3.405, 8.5125, tuning=tuning).neighbor_list.half_list  # the kind of list the model makes
    for name, atoms in (("loose", loose), ("dense", dense)):
        nl = BatchedNeighborList(cutoff=8.5125, skin=0.5, half_list=half, tuning=tuning)
        b = Batch.from_atoms([atoms])
        nl.update(b)
        most[name] = int(nl.most_neighbors(b).max())
    assert most["dense"] > most["loose"]
    data = [AtomicData.from_atoms(a) for a in (loose, loose, dense)]
    for i, d in enumerate(data):
        d.system_id = torch.tensor([i])
    sampler = SizeAwareSampler(ListDataset(data), max_atoms=108, max_batch_size=1, bin_width=1)
    sink = HostMemory(capacity=None)
    model = LennardJones(0.0104, 3.405, 8.5125, skin=0.5, max_neighbors=most["loose"], tuning=tuning)
    stage = DemoDynamics(model=model, n_steps=2, dt=0.5, sampler=sampler, sinks=[sink], refill_frequency=1)
    with pytest.raises(CapacityError, match=r"systems \[2\] had up to \d+ neighbours.*pass max_neighbors="):
        stage.run()
    assert sorted(sink.read().system_id.tolist()) == [0, 1]


def test_self_sizing_list_fits_the_densest_atom(ref, tuning):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3)
    nl = BatchedNeighborList(cutoff=8.5125, skin=0.5, half_list=False, tuning=tuning)
    assert nl.max_neighbors == 32
    matrix = nl.update(ref.batch([atoms]))
    # FCC shells within 9.0125 Å at a = 5.26: a/sqrt2, a, a sqrt1.5, a sqrt2, a sqrt2.5 (a sqrt3 = 9.11 out).
    assert matrix.count.tolist() == [12 + 6 + 24 + 12 + 24] * len(atoms)
    assert nl.max_neighbors >= 78
    assert nl.memory_bytes() > 0
    half = BatchedNeighborList(cutoff=8.5125, skin=0.5, half_list=True, tuning=tuning)
    counts = half.update(ref.batch([atoms])).count
    assert counts.sum().item() == 78 * len(atoms) // 2
    assert counts.max().item() <= 45  # rows about equally long, so the matrix halves too
    assert half.max_neighbors < 0.6 * nl.max_neighbors


def test_atoms_far_outside_the_cell_are_wrapped_exactly(ref, tuning):
    """Positions are wrapped into the cell at each build, so an atom 600 cells away (in float64)
    has the same neighbours and forces as its image inside the cell."""
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(2)
    atoms.rattle(0.05, seed=4)
    far = atoms.copy()
    far.positions[0] += 600 * atoms.cell[0] - 250 * atoms.cell[2]
    model = LennardJones(0.0104, 3.405, 8.5125, tuning=tuning)
    near_out, far_out = model(ref.batch([atoms])), model(ref.batch([far]))
    torch.testing.assert_close(far_out["energy"], near_out["energy"], rtol=1e-12, atol=0.0)
    torch.testing.assert_close(far_out["forces"], near_out["forces"], rtol=1e-9, atol=1e-12)


def test_non_finite_positions_are_reported(ref, tuning):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True)
    batch = ref.batch([atoms, atoms])
    nl = BatchedNeighborList(cutoff=6.0, tuning=tuning)
    nl.update(batch)
    nl.verify(batch)
    batch.positions[5, 1] = float("nan")
    nl.update(batch)
    with pytest.raises(InvalidDataError, match=r"systems \[1\] lie more than a million cells .* non-finite"):
        nl.verify(batch)


def test_images_beyond_what_an_entry_holds_are_reported(ref, tuning):
    """A chain of 4 atoms in a periodic cell 0.03 Å long sees images 300 cells away, beyond
    the +-255 its entries hold (9 image bits): verify() says so instead of dropping them."""
    import ase

    chain = ase.Atoms("Ar4", positions=[[0.0, 0, 0], [0.01, 3, 0], [0.02, 0, 3], [0.005, 3, 3]],
                      cell=[[0.03, 0, 0], [0, 0, 0], [0, 0, 0]], pbc=(True, False, False))
    batch = ref.batch([chain])
    nl = BatchedNeighborList(cutoff=8.0, skin=1.0, tuning=tuning)
    nl.update(batch)
    with pytest.raises(InvalidDataError, match="periodic images further away than their neighbour entries hold"):
        nl.verify(batch)


def test_a_cell_that_loses_its_volume_is_reported(ref, tuning):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True)
    batch = ref.batch([atoms])
    nl = BatchedNeighborList(cutoff=6.0, tuning=tuning)
    nl.update(batch)
    nl.verify(batch)
    batch.cell[0, 2] = batch.cell[0, 0] + batch.cell[0, 1]  # coplanar rows
    nl.update(batch)
    with pytest.raises(InvalidDataError, match="zero"):
        nl.verify(batch)


def test_new_batches_never_inherit_a_freed_batchs_lists(ref, rng, tuning):
    """Batches made and dropped in a loop (their ids get reused) with the same sizes but other
    systems: every result is that of a fresh model."""
    small = [ref.atoms(rng, 5, ref.cell(rng, (6.0, 6.5, 7.0), 0.2), True, min_distance=2.0) for _ in range(2)]
    large = [ref.atoms(rng, 9, ref.cell(rng, (7.5, 8.0, 7.0), 0.2), True, min_distance=2.0) for _ in range(2)]
    model = LennardJones(0.01, 2.3, RC, tuning=tuning)
    rounds = [[small[k % 2], large[(k // 2) % 2]] if k % 3 else [large[k % 2], small[(k // 2) % 2]] for k in range(12)]
    results = []
    for pair in rounds:
        batch = ref.batch(pair)  # CPython hands the freed batch's id (and version) out again
        results.append(model(batch)["forces"])
        del batch
    for k, pair in enumerate(rounds):
        expected = LennardJones(0.01, 2.3, RC, tuning=tuning)(ref.batch(pair))
        torch.testing.assert_close(results[k], expected["forces"], msg=f"round {k}")


def test_models_copy_and_pickle_without_device_state(ref, tuning):
    import copy
    import pickle

    batch = ref.batch([bulk("Ar", "fcc", a=5.26, cubic=True)])
    model = LennardJones(0.0104, 3.405, 8.5, tuning=tuning)
    expected = model(batch)["energy"]
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        torch.testing.assert_close(clone(batch)["energy"], expected)


def _matrix(nl, batch):
    m = nl.update(batch)
    counts = m.count.clone()
    rows = [m.entries[: int(c), t].clone() for t, c in enumerate(counts.tolist())]
    return counts, rows


@pytest.mark.parametrize("parts", [2, 5, 7, 13])  # 13: more counts than the build's scratch holds
@pytest.mark.parametrize("half", [False, True], ids=["full", "half"])
def test_a_search_in_parts_lists_the_same_entries_in_the_same_order(ref, rng, half, parts, tuning):
    """A GPU searches each slot's box in parts (a count pass, then a write pass at the counted
    offsets); run here on the CPU, it gives the one-thread search's matrix bit for bit: many
    images, open axes, atoms outside their cell, parts with no bin columns (7 of 25 and more)."""
    systems = some_systems(ref, rng)
    batch = ref.batch(systems)
    whole = _matrix(BatchedNeighborList(cutoff=RC, skin=0.4, half_list=half, tuning=tuning), batch)
    # These systems are small and differ in size: parts only when forced.
    split_list = BatchedNeighborList(cutoff=RC, skin=0.4, half_list=half, tuning=_cpu(force_search_parts=parts))
    split = _matrix(split_list, batch)
    assert split_list._layout.search_parts == parts
    assert torch.equal(whole[0], split[0]) and int(whole[0].sum()) > 0
    assert all(torch.equal(a, b) for a, b in zip(whole[1], split[1]))
    # A later partial rebuild (one system moved) in parts equals a fresh one-thread build.
    moved = ref.batch(systems)
    moved.positions[:5] += 0.3
    fresh = _matrix(BatchedNeighborList(cutoff=RC, skin=0.4, half_list=half, tuning=_cpu(force_search_parts=1)),
                    moved)
    batch.positions[:5] += 0.3
    again = _matrix(split_list, batch)
    assert torch.equal(fresh[0], again[0])
    assert all(torch.equal(a, b) for a, b in zip(fresh[1], again[1]))


@pytest.mark.parametrize("parts", [1, 5])
@pytest.mark.parametrize("half", [False, True], ids=["full", "half"])
def test_a_listed_search_lists_the_same_entries_as_a_search_of_every_slot(ref, rng, half, parts):
    """A GPU's search walks only the slots of the systems that rebuild, listed on the device;
    run here on the CPU (a few threads striding over the list), its matrix equals the search of
    every slot bit for bit, at the first build and after rebuilds of some systems only, while
    the systems that keep their lists keep their entries."""
    systems = some_systems(ref, rng)
    batch, listed_batch = ref.batch(systems), ref.batch(systems)
    plain = BatchedNeighborList(cutoff=RC, skin=0.4, half_list=half,
                                tuning=_cpu(force_search_parts=parts, search_listed=False))
    listed = BatchedNeighborList(cutoff=RC, skin=0.4, half_list=half,
                                 tuning=_cpu(force_search_parts=parts, search_listed=True))
    first = _matrix(listed, listed_batch)
    assert listed._layout.listed and listed._layout.search_parts == parts
    expected = _matrix(plain, batch)
    assert not plain._layout.listed
    assert torch.equal(expected[0], first[0]) and int(first[0].sum()) > 0
    assert all(torch.equal(x, y) for x, y in zip(expected[1], first[1]))
    for moved in (slice(0, 5), slice(-3, None)):  # the first system's atoms, then the last's
        for b in (batch, listed_batch):
            b.positions[moved] += 0.3
        expected = _matrix(plain, batch)
        again = _matrix(listed, listed_batch)
        assert torch.equal(expected[0], again[0])
        assert all(torch.equal(x, y) for x, y in zip(expected[1], again[1]))
    builds = listed.builds(listed_batch)
    assert int(builds.min()) == 1 and int(builds.max()) == 2  # only the moved systems rebuilt


def test_a_search_in_parts_counts_in_the_build_scratch(ref, rng):
    """The counts of a search in parts (int16 per slot and part) live in the memory where a
    build keeps each atom's bin, place and wrap until the sort: up to ten parts cost nothing."""
    batch = ref.batch(some_systems(ref, rng))
    held = {}
    for parts in (1, 9, 11):
        nl = BatchedNeighborList(cutoff=RC, skin=0.4, tuning=_cpu(force_search_parts=parts))
        nl.update(batch)
        held[parts] = nl.memory_bytes()
    assert held[9] == held[1]
    assert held[11] == held[1] + 2 * 11 * batch.num_nodes  # its own int16 counts


def test_a_search_in_parts_reports_overflow_with_the_true_count(tuning):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3)
    batch = Batch.from_atoms([atoms])
    exact_list = BatchedNeighborList(cutoff=8.5125, skin=0.5, tuning=tuning)
    exact_list.update(batch)
    exact = int(exact_list.most_neighbors(batch).max())
    # One system of 108 atoms: parts only when forced.
    tight = BatchedNeighborList(cutoff=8.5125, skin=0.5, max_neighbors=exact // 2, tuning=_cpu(tuning, force_search_parts=5))
    m = tight.update(batch)
    assert int(m.count.max()) == m.entries.shape[0]  # full rows, no write past them
    with pytest.raises(CapacityError, match=rf"had up to {exact} neighbours"):
        tight.verify(batch)


def test_the_search_runs_in_parts_only_for_small_batches_of_many_systems():
    """In parts where few slots rebuild at a step (a batch of up to 300,000 atoms of many
    systems, rebuilding one at a time); one thread per slot where enough rebuild to fill the GPU
    (large batches, one large system, cohorts), measured on the H200 (layout.py)."""
    from alchemi_potentials.neighbors.layout import search_parts

    gpu, cpu = PotentialsTuning.for_device("cuda"), PotentialsTuning.for_device("cpu")
    assert search_parts(gpu, np.full(1024, 256)) == 9
    assert search_parts(gpu, np.full(16, 256)) == 9
    assert search_parts(gpu, np.full(2048, 108)) == 9  # small systems too, with the listed search
    assert search_parts(gpu, np.full(2048, 256)) == 1  # 524,288 atoms
    assert search_parts(gpu, np.full(65536, 256)) == 1
    assert search_parts(gpu, np.array([1 << 20])) == 1
    assert search_parts(gpu, np.array([20_000] + [256] * 1000)) == 1  # one holds 7 %
    assert search_parts(gpu, np.zeros(0, dtype=np.int64)) == 9
    assert search_parts(cpu, np.full(1024, 256)) == 1
    # Rebuilds in cohorts: one pass of one thread per slot, whatever the batch.
    assert search_parts(gpu, np.full(1024, 256), join_fraction=0.8) == 1
    assert search_parts(gpu, np.full(2048, 108), join_fraction=0.99) == 1


def _cpu(base: PotentialsTuning | None = None, **changes: object) -> PotentialsTuning:
    """``base`` (default: a CPU's tuning) with ``changes``."""
    return attrs.evolve(base or PotentialsTuning.for_device("cpu"), **changes)
