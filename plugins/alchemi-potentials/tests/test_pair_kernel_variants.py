"""Every variant of the pair kernel against the numpy reference: neighbours read one, two or
four at a time (the GPU reads four; here forced on the CPU), totals added directly or folded
per chunk (large systems), half and full lists, one or several species, switched or not."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch

from alchemi_core.testing.fixtures import CPU_AND_GPU
from alchemi_potentials import LennardJones, Morse, pair_potential
from alchemi_potentials.neighbors import BatchedNeighborList
from alchemi_potentials.tuning import PotentialsTuning

RC = 7.0


def systems(ref, rng):
    """Mixed species, triclinic, partly periodic and open: uneven neighbour counts everywhere."""
    return [
        ref.atoms(rng, 18, ref.cell(rng, (10.0, 11.0, 10.5), 0.3), True, species=(10, 18, 36), min_distance=2.5),
        ref.atoms(rng, 13, ref.cell(rng, (9.0, 9.5, 12.0), 0.2), (True, False, True), species=(18, 36)),
        ref.atoms(rng, 4, ref.cell(rng, (4.0, 4.5, 5.0), 0.2), True, species=(18,), min_distance=2.5),
        ref.atoms(rng, 11, np.diag([9.0, 9.0, 9.0]), False, species=(10, 18)),
    ]


EPS = {10: 0.0031, 18: 0.0104, 36: 0.0141}
SIG = {10: 2.75, 18: 3.405, 36: 3.65}


def lennard_jones_reference(ref):
    def e_of(a, b):
        return np.sqrt(np.vectorize(EPS.get)(a) * np.vectorize(EPS.get)(b))

    def s_of(a, b):
        return 0.5 * (np.vectorize(SIG.get)(a) + np.vectorize(SIG.get)(b))

    return ref.lennard_jones(e_of, s_of, RC, shift=False)


def morse_reference(ref):
    return ref.morse(lambda a, b: 0.2, lambda a, b: 1.4, lambda a, b: 3.6, RC, shift=False, onset=5.5)


MODELS = {
    "lennard-jones mixed": (lambda nl, tuning: LennardJones(EPS, SIG, RC, neighbor_list=nl, tuning=tuning),
                            lennard_jones_reference),
    "morse switched": (lambda nl, tuning: Morse(D=0.2, alpha=1.4, r0=3.6, cutoff=RC, switch_onset=5.5,
                                                neighbor_list=nl, tuning=tuning),
                       morse_reference),
}


def check_against_reference(ref, structures, out, pair):
    ptr = np.concatenate(([0], np.cumsum([len(a) for a in structures])))
    for s, atoms in enumerate(structures):
        e, f, w = ref.pairs(atoms.positions, atoms.numbers, atoms.cell.array, atoms.pbc, RC, pair)
        assert abs(out["energy"][s, 0].item() - e) <= 1e-9 * abs(e), f"system {s} energy"
        ref.close(out["forces"][ptr[s] : ptr[s + 1]], f, rtol=1e-9, what=f"system {s} forces")
        if atoms.pbc.all():
            ref.close(out["stress"][s], w / abs(np.linalg.det(atoms.cell.array)), rtol=1e-9, what=f"system {s} stress")


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize(("unroll", "order"), [(2, "rows"), (4, "rows"), (4, "columns")])
@pytest.mark.parametrize("half", [False, True], ids=["full", "half"])
def test_unrolled_neighbour_reads_give_the_reference(ref, rng, model, unroll, order, half):
    """(The GPU's choice is 4 at a time from a [columns, atoms] matrix.)"""
    tuning = attrs.evolve(PotentialsTuning.for_device("cpu"), unroll=unroll, matrix_order=order)
    make, reference = MODELS[model]
    structures = systems(ref, rng)
    out = make(BatchedNeighborList(RC, 0.5, half_list=half, tuning=tuning), tuning)(ref.batch(structures),
                                                                                     compute_stress=True)
    check_against_reference(ref, structures, out, reference(ref))


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("masked", [False, True], ids=["branching", "masked"])
@pytest.mark.parametrize("half", [False, True], ids=["full", "half"])
def test_pairs_past_the_cutoff_branched_around_or_masked_give_the_reference(ref, rng, model, masked, half):
    """(A CPU masks, a GPU branches.) The skin of 1.5 Å puts many listed pairs past the cutoff."""
    tuning = attrs.evolve(PotentialsTuning.for_device("cpu"), masked=masked)
    make, reference = MODELS[model]
    structures = systems(ref, rng)
    out = make(BatchedNeighborList(RC, 1.5, half_list=half), tuning)(ref.batch(structures), compute_stress=True)
    check_against_reference(ref, structures, out, reference(ref))


@pytest.mark.parametrize("half", [False, True], ids=["full", "half"])
def test_totals_folded_per_chunk_give_the_reference(ref, rng, monkeypatch, half):
    """Large systems sum per slot and fold chunk by chunk; here every system does (chunks of 4,
    so systems span several chunks and chunks end at system boundaries)."""
    monkeypatch.setattr(pair_potential, "DIRECT_TOTALS_UP_TO", 0)
    monkeypatch.setattr(pair_potential, "FOLD_CHUNK", 4)
    structures = systems(ref, rng)
    model = LennardJones(EPS, SIG, RC, neighbor_list=BatchedNeighborList(RC, 0.5, half_list=half))
    out = model(ref.batch(structures), compute_stress=True)
    check_against_reference(ref, structures, out, lennard_jones_reference(ref))
    energy_only = model(ref.batch(structures))  # the fold without virials
    torch.testing.assert_close(energy_only["energy"], out["energy"], rtol=1e-12, atol=0.0)


def test_fold_chunks_cover_every_slot_once(monkeypatch):
    counts = np.array([3, 0, 10, 1])
    assert pair_potential._fold_chunks(counts, torch.device("cpu")) is None  # small systems add directly
    monkeypatch.setattr(pair_potential, "DIRECT_TOTALS_UP_TO", 0)
    monkeypatch.setattr(pair_potential, "FOLD_CHUNK", 4)
    chunks = pair_potential._fold_chunks(counts, torch.device("cpu")).numpy()
    assert chunks.tolist() == [[0, 3, 0], [3, 7, 2], [7, 11, 2], [11, 13, 2], [13, 14, 3]]


@pytest.fixture
def torch_threads():
    """Set torch's intra-op thread count (the CPU kernels' worker threads) for one test."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def _max_threads_per_block(module_tag: str) -> list[int]:
    """The largest block each compiled CUDA pair kernel whose Warp module ends in ``module_tag``
    may be launched with, as the driver reports it: 1,024 on current GPUs, or the launch bounds'
    first number where the kernel was compiled with them."""
    import ctypes

    from warp._src import context

    cuda = ctypes.CDLL("libcuda.so.1")
    found = []
    for name, module in context.user_modules.items():
        if name.startswith("alchemi_potentials.pair_forces.") and name.endswith(module_tag):
            for executable in module.execs.values():
                for hooks in executable.kernel_hooks.values():
                    value = ctypes.c_int()
                    # CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
                    cuda.cuFuncGetAttribute(ctypes.byref(value), 0, ctypes.c_void_p(hooks.forward))
                    found.append(value.value)
    return found


@pytest.mark.parametrize("device", CPU_AND_GPU)
def test_large_systems_kernel_with_launch_bounds_gives_the_reference(ref, rng, monkeypatch, device):
    """Large systems' variant (per-slot totals) is compiled with launch bounds on a GPU
    (``PotentialsTuning.min_blocks_large``: four blocks of 256 threads per multiprocessor); here every system
    takes it. The bounds reach the compiled kernel where the warp-lang has them (1.19, not 1.5)."""
    import inspect

    import warp as wp

    monkeypatch.setattr(pair_potential, "DIRECT_TOTALS_UP_TO", 0)
    tuning = attrs.evolve(PotentialsTuning.for_device(device), min_blocks_large=4)
    structures = systems(ref, rng)
    model = LennardJones(EPS, SIG, RC, neighbor_list=BatchedNeighborList(RC, 0.5), tuning=tuning)
    out = model(ref.batch(structures, device=device), compute_stress=True)
    check_against_reference(ref, structures, {k: v.cpu() for k, v in out.items()}, lennard_jones_reference(ref))
    if device == "cuda" and "launch_bounds" in inspect.signature(wp.kernel).parameters:
        bounds = _max_threads_per_block("_b4")  # the instances loaded so far (float64 here)
        assert bounds and all(b == 256 for b in bounds), bounds  # 1,024 without launch bounds
