"""On a CUDA GPU: the numbers of the numpy references, torch's stream, no host sync and no
allocation per step, CUDA-graph replays that rebuild the neighbour list on the device, and one
large system costing what many small ones do.

Every reference here is numpy (brute force over images, or over ``ase.neighborlist`` pairs):
the GPU machine's Warp may have no CPU backend, so nothing runs Warp on the CPU.
Skipped where there is no CUDA device (see conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.build import bulk

from alchemi_core.data import Batch
from alchemi_core.testing.gpu import no_host_sync
from alchemi_potentials import LennardJones, Morse, pair_potential
from alchemi_potentials.neighbors import BatchedNeighborList

pytestmark = pytest.mark.gpu

EPS, SIG, RC = 0.0104, 3.405, 8.5125
MIXED_EPS, MIXED_SIG = {18: 0.0104, 36: 0.0141}, {18: 3.405, 36: 3.65}


def mixed_structures(ref, rng):
    fcc = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3)
    fcc.rattle(0.1, seed=1)
    fcc.numbers[::5] = 36
    return [
        fcc,
        ref.atoms(rng, 6, ref.cell(rng, (5.0, 5.5, 6.0), 0.2), True, species=(18, 36), min_distance=2.8),
        ref.atoms(rng, 20, ref.cell(rng, (11.0, 12.0, 10.0), 0.35), True, species=(18, 36)),
        ref.atoms(rng, 14, ref.cell(rng, (9.0, 10.0, 14.0), 0.2), (True, False, True), species=(18, 36)),
        ref.atoms(rng, 12, np.diag([9.0, 9.0, 9.0]), False, species=(18, 36)),
    ]


def lj_pair(ref, mixed: bool):
    if not mixed:
        return ref.lennard_jones(lambda a, b: EPS, lambda a, b: SIG, RC, shift=False)

    def e_of(a, b):
        return np.sqrt(np.vectorize(MIXED_EPS.get)(a) * np.vectorize(MIXED_EPS.get)(b))

    def s_of(a, b):
        return 0.5 * (np.vectorize(MIXED_SIG.get)(a) + np.vectorize(MIXED_SIG.get)(b))

    return ref.lennard_jones(e_of, s_of, RC, shift=False)


# name -> (model factory, reference pair function, cutoff)
CASES = {
    "lennard-jones": (lambda: LennardJones(EPS, SIG, RC), lambda ref: lj_pair(ref, False), RC),
    "lennard-jones-mixed": (lambda: LennardJones(MIXED_EPS, MIXED_SIG, RC), lambda ref: lj_pair(ref, True), RC),
    "lennard-jones-half-list": (
        lambda: LennardJones(EPS, SIG, RC, neighbor_list=BatchedNeighborList(RC, 0.5, half_list=True)),
        lambda ref: lj_pair(ref, False), RC),
    "morse-switched": (
        lambda: Morse(D=0.35, alpha=1.3, r0=3.8, cutoff=8.0, switch_onset=6.5),
        lambda ref: ref.morse(lambda a, b: 0.35, lambda a, b: 1.3, lambda a, b: 3.8, 8.0, shift=False, onset=6.5), 8.0),
}


def with_outputs(batch: Batch) -> Batch:
    dtype, dev = batch.positions.dtype, batch.device
    batch.set_field("forces", torch.zeros_like(batch.positions), "node")
    batch.set_field("energy", torch.zeros(batch.num_graphs, 1, dtype=dtype, device=dev), "system")
    batch.set_field("stress", torch.zeros(batch.num_graphs, 3, 3, dtype=dtype, device=dev), "system")
    return batch


def assert_matches(ref, structures, out, pair, cutoff, rtol, stress=True, by_neighbor_list=False):
    ptr = np.concatenate(([0], np.cumsum([len(a) for a in structures])))
    for s, atoms in enumerate(structures):
        if by_neighbor_list:
            e, f, w = ref.pairs_by_neighbor_list(atoms, cutoff, pair)
        else:
            e, f, w = ref.pairs(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc, cutoff, pair)
        assert abs(out["energy"][s, 0].item() - e) <= rtol * abs(e), f"system {s} energy"
        ref.close(out["forces"][ptr[s] : ptr[s + 1]].cpu(), f, rtol=rtol, what=f"system {s} forces")
        if stress and atoms.pbc.all():
            ref.close(out["stress"][s].cpu(), w / abs(np.linalg.det(atoms.cell.array)), rtol=rtol, what=f"system {s} stress")


@pytest.mark.parametrize("fold", [False, True], ids=["direct-totals", "folded-totals"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_matches_the_numpy_reference(ref, rng, monkeypatch, case, fold):
    if fold:  # the path of systems larger than DIRECT_TOTALS_UP_TO, here for every system
        monkeypatch.setattr(pair_potential, "DIRECT_TOTALS_UP_TO", 0)
        monkeypatch.setattr(pair_potential, "FOLD_CHUNK", 8)
    make, pair_of, cutoff = CASES[case]
    structures = mixed_structures(ref, rng)
    pair = pair_of(ref)
    out64 = make()(ref.batch(structures, device="cuda"), compute_stress=True)
    assert_matches(ref, structures, out64, pair, cutoff, rtol=1e-9)
    out32 = make()(ref.batch(structures, dtype=torch.float32, device="cuda"), compute_stress=True)
    assert out32["forces"].dtype == torch.float32
    for key in ("energy", "forces"):  # against the batch's largest magnitude: energies may cancel
        scale = out64[key].abs().max()
        assert (out32[key].double() - out64[key]).abs().max() < 1e-4 * scale, key


def test_kernels_follow_torchs_current_stream(ref):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(4)
    batch = with_outputs(ref.batch([atoms] * 8, dtype=torch.float32, device="cuda"))
    model = LennardJones(EPS, SIG, RC)
    model(batch)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    shift = torch.zeros_like(batch.positions)
    shift[::7, 0] = 0.3  # beyond skin/2: the lists rebuild in this forward
    with torch.cuda.stream(side):
        side.wait_stream(torch.cuda.current_stream())
        # Queued on the side stream just before the forward: the kernels must see the moved atoms.
        torch.cuda._sleep(20_000_000)  # keep the stream busy so a kernel on another stream would race
        batch.positions.add_(shift)
        out = model(batch)
    side.synchronize()
    moved = batch.to("cpu").to_atoms()
    assert_matches(ref, moved, out, lj_pair(ref, False), RC, rtol=2e-4, stress=False, by_neighbor_list=True)


def test_a_step_makes_no_host_sync_and_allocates_nothing(ref):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(4)
    batch = with_outputs(ref.batch([atoms] * 16, dtype=torch.float32, device="cuda"))
    models = [LennardJones(EPS, SIG, RC, max_neighbors=110),
              LennardJones(EPS, SIG, RC, neighbor_list=BatchedNeighborList(RC, 0.5, max_neighbors=60, half_list=True))]
    # Every atom moves 0.6 skins every step, past half the largest skin: rebuilds included.
    skin = max(model.neighbor_list.skin_on("cuda") for model in models)
    step = torch.full_like(batch.positions, 0.6 * skin / 3**0.5)
    for model in models:
        model.check_batch(batch)
        model(batch, compute_stress=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with no_host_sync():
        for k in range(6):
            batch.positions.add_(step if k % 2 else -step)
            for model in models:
                model(batch, compute_stress=True)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    for model in models:
        assert model.neighbor_list.builds(batch).min().item() >= 4
        model.verify(batch)


def test_cuda_graph_replays_rebuild_on_the_device(ref):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3)
    batch = with_outputs(ref.batch([atoms] * 32, dtype=torch.float32, device="cuda"))
    model = LennardJones(EPS, SIG, RC, skin=0.5, max_neighbors=110)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(batch)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(batch)
    g = torch.Generator(device="cuda").manual_seed(0)
    builds0 = model.neighbor_list.builds(batch).clone()
    pair = lj_pair(ref, False)
    for k in range(8):
        # Small moves, and a large one for a few systems at step 4: only those rebuild.
        batch.positions.add_(0.01 * torch.randn(batch.positions.shape, generator=g, device="cuda"))
        if k == 4:
            batch.positions[: 3 * len(atoms)] += 0.3
        graph.replay()
        torch.cuda.synchronize()
        # The rebuilt systems and as many kept ones, against the reference.
        moved = batch.to("cpu").to_atoms()[:6]
        out = {"energy": batch.energy, "forces": batch.forces[: 6 * len(atoms)]}
        assert_matches(ref, moved, out, pair, RC, rtol=2e-4, stress=False, by_neighbor_list=True)
    grew = (model.neighbor_list.builds(batch) - builds0).cpu()
    assert (grew[:3] >= 1).all() and (grew[3:] == 0).all()


def test_one_large_system_equals_many_small_ones(ref):
    """A 32,000-atom crystal (per-slot totals, folded) has the energy per atom and the forces of
    the same crystal as 32 systems of 1,000 atoms (direct totals), and of the numpy reference."""
    crystal = bulk("Ar", "fcc", a=5.26, cubic=True)
    small = crystal.repeat(5)  # 500 atoms
    small.rattle(0.02, seed=3)
    large = small.repeat((4, 4, 4))  # 32,000 atoms, the same rattle in every copy
    model = LennardJones(EPS, SIG, RC)
    one = model(with_outputs(ref.batch([large], device="cuda")), compute_stress=True)
    many = LennardJones(EPS, SIG, RC)(with_outputs(ref.batch([small] * 64, device="cuda")), compute_stress=True)
    assert model._outputs.held, "the large system should fold its totals per chunk"
    e_small, f_small, w_small = ref.pairs_by_neighbor_list(small, RC, lj_pair(ref, False))
    torch.testing.assert_close(one["energy"][0, 0].item() / 64, e_small, rtol=1e-10, atol=0.0)
    torch.testing.assert_close(many["energy"][:, 0].cpu().double(), torch.full((64,), e_small, dtype=torch.float64),
                               rtol=1e-10, atol=0.0)
    f_large = one["forces"].cpu().numpy().reshape(64, len(small), 3)
    assert np.abs(f_large - f_small[None]).max() < 1e-9 * np.abs(f_small).max()
    volume = abs(np.linalg.det(small.cell.array))
    np.testing.assert_allclose(one["stress"][0].cpu().numpy(), w_small / volume, rtol=1e-9, atol=1e-14)


def test_memory_per_atom_is_small(ref):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(4)
    batch = with_outputs(ref.batch([atoms] * 64, dtype=torch.float32, device="cuda"))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model = LennardJones(EPS, SIG, RC)
    model(batch)
    torch.cuda.synchronize()
    per_atom = (torch.cuda.max_memory_allocated() - base) / batch.num_nodes
    assert per_atom < 1024, f"{per_atom:.0f} bytes per atom"


def test_a_check_with_a_neighbour_list_model_reads_back_once(ref):
    """The neighbour list's error records ride on the check's one read-back (error_flag): a
    quiet check of a run with Lennard-Jones synchronises once."""
    from alchemi_core.dynamics import DemoDynamics
    from alchemi_core.testing import never_converging
    from alchemi_core.testing.gpu import check_syncs

    cells = [bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3) for _ in range(3)]
    batch = Batch.from_atoms(cells, dtype=torch.float32).to("cuda")
    stage = DemoDynamics(model=LennardJones(EPS, SIG, RC), n_steps=50, dt=1.0,
                         convergence_hook=never_converging(frequency=1))
    engine = stage._make_engine()
    engine.prepare(batch)
    engine.check(0)  # the first check may set things up
    syncs = check_syncs(engine, 1)
    assert len(syncs) == 1, syncs
