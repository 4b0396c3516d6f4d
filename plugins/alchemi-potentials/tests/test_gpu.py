"""On a CUDA GPU: the same numbers as on the CPU, torch's stream, no host sync, no allocation,
and a CUDA graph whose replays rebuild the neighbour list on the device when atoms move.

Skipped where there is no CUDA device (see conftest.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.build import bulk

from alchemi_core.data import Batch
from alchemi_potentials import LennardJones, Morse

pytestmark = pytest.mark.gpu

EPS, SIG, RC = 0.0104, 3.405, 8.5125


def mixed_structures(ref, rng):
    fcc = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(3)
    fcc.rattle(0.1, seed=1)
    return [
        fcc,
        ref.atoms(rng, 6, ref.cell(rng, (5.0, 5.5, 6.0), 0.2), True, min_distance=2.8),
        ref.atoms(rng, 20, ref.cell(rng, (11.0, 12.0, 10.0), 0.35), True),
        ref.atoms(rng, 14, ref.cell(rng, (9.0, 10.0, 14.0), 0.2), (True, False, True)),
        ref.atoms(rng, 12, np.diag([9.0, 9.0, 9.0]), False),
    ]


def with_outputs(batch: Batch) -> Batch:
    batch.set_field("forces", torch.zeros_like(batch.positions), "node")
    batch.set_field("energy", torch.zeros(batch.num_graphs, 1, dtype=batch.positions.dtype, device=batch.device), "system")
    return batch


@pytest.mark.parametrize("model_factory", [
    lambda: LennardJones(EPS, SIG, RC),
    lambda: Morse(D=0.35, alpha=1.3, r0=3.8, cutoff=8.0, switch_onset=6.5),
], ids=["lennard-jones", "morse"])
def test_cuda_matches_cpu(ref, rng, model_factory):
    structures = mixed_structures(ref, rng)
    cpu = model_factory()(ref.batch(structures), compute_stress=True)
    gpu64 = model_factory()(ref.batch(structures, device="cuda"), compute_stress=True)
    gpu32 = model_factory()(ref.batch(structures, dtype=torch.float32, device="cuda"), compute_stress=True)
    for key in ("energy", "forces"):
        torch.testing.assert_close(gpu64[key].cpu(), cpu[key], rtol=1e-10, atol=1e-12)
        scale = cpu[key].abs().max()
        assert (gpu32[key].cpu().double() - cpu[key]).abs().max() < 1e-4 * scale
    finite = torch.isfinite(cpu["stress"])
    torch.testing.assert_close(gpu64["stress"].cpu()[finite], cpu["stress"][finite], rtol=1e-10, atol=1e-12)


def test_kernels_follow_torchs_current_stream(ref):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(4)
    batch = with_outputs(ref.batch([atoms] * 8, dtype=torch.float32, device="cuda"))
    model = LennardJones(EPS, SIG, RC)
    model(batch)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    shift = torch.zeros_like(batch.positions)
    shift[::7, 0] = 0.2
    with torch.cuda.stream(side):
        side.wait_stream(torch.cuda.current_stream())
        # Queued on the side stream just before the forward: the kernels must see the moved atoms.
        torch.cuda._sleep(20_000_000)  # keep the stream busy so a kernel on another stream would race
        batch.positions.add_(shift)
        out = model(batch)
    side.synchronize()
    expected = LennardJones(EPS, SIG, RC)(ref.batch(batch.to("cpu").to_atoms(), dtype=torch.float64))
    assert (out["forces"].cpu().double() - expected["forces"]).abs().max() < 1e-4 * expected["forces"].abs().max()


def test_a_step_makes_no_host_sync_and_allocates_nothing(ref):
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(4)
    batch = with_outputs(ref.batch([atoms] * 16, dtype=torch.float32, device="cuda"))
    model = LennardJones(EPS, SIG, RC, max_neighbors=110)
    model.check_batch(batch)
    model(batch, compute_stress=True)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    step = torch.full_like(batch.positions, 0.2)  # > skin / 2 every other step: rebuilds included
    torch.cuda.set_sync_debug_mode("error")
    try:
        for k in range(6):
            batch.positions.add_(step if k % 2 else -step)
            model(batch, compute_stress=True)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
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
    for k in range(8):
        # Small moves, and a large one for a few systems at step 4: only those rebuild.
        batch.positions.add_(0.01 * torch.randn(batch.positions.shape, generator=g, device="cuda"))
        if k == 4:
            batch.positions[: 3 * len(atoms)] += 0.3
        graph.replay()
        fresh = LennardJones(EPS, SIG, RC)(with_outputs(Batch.from_atoms(batch.to("cpu").to_atoms(), dtype=torch.float64)))
        err = (batch.forces.cpu().double() - fresh["forces"]).abs().max()
        assert err < 1e-4 * fresh["forces"].abs().max(), f"replay {k}"
        torch.testing.assert_close(batch.energy.cpu().double(), fresh["energy"], rtol=1e-5, atol=1e-6)
    grew = (model.neighbor_list.builds(batch) - builds0).cpu()
    assert (grew[:3] >= 1).all() and (grew[3:] == 0).all()


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
    assert per_atom < 2048, f"{per_atom:.0f} bytes per atom"
