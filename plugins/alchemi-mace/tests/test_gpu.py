"""model:mace on a GPU: a captured step replays like the eager one and allocates nothing."""

from __future__ import annotations

import pytest
import torch
from alchemi_mace import MaceModel

from alchemi_core.data import Batch
from alchemi_core.testing.gpu import eager_and_captured, langevin, step_allocations
from alchemi_potentials.cueq import cueq_kernels_installed
from alchemi_potentials.testing import (
    compare_with_calculator,
    copper_cells,
    reference_structures,
    relax_then_md,
)

pytestmark = pytest.mark.gpu

needs_cueq_kernels = pytest.mark.skipif(not cueq_kernels_installed(),
                                        reason="needs cuequivariance-torch with its CUDA kernels")


def test_gpu_float64_equals_mace_calculator(mp_small_file):
    from mace.calculators import MACECalculator

    model = MaceModel(model_path=mp_small_file, trust_model_file=True, dtype="float64", enable_cueq=False)
    calc = MACECalculator(model_paths=str(mp_small_file), device="cuda", default_dtype="float64")
    compare_with_calculator(model, calc, reference_structures(), torch.float64, energy_tol=1e-8, force_tol=1e-8,
                            stress_tol=1e-8, device="cuda")


@needs_cueq_kernels
def test_cueq_kernels_equal_mace_calculator(mp_small_file):
    """Unasked, a GPU with cuEquivariance's kernels runs the network on them; results are still
    MACE's own (its calculator on e3nn's kernels), float64 to 1e-7."""
    from mace.calculators import MACECalculator

    model = MaceModel(model_path=mp_small_file, trust_model_file=True, dtype="float64")
    calc = MACECalculator(model_paths=str(mp_small_file), device="cuda", default_dtype="float64")
    compare_with_calculator(model, calc, reference_structures(), torch.float64, energy_tol=1e-7, force_tol=1e-7,
                            stress_tol=1e-7, device="cuda")
    assert model.uses_cueq


@needs_cueq_kernels
def test_cueq_captured_step_equals_eager_e3nn():
    """A captured float32 step on cuEquivariance's kernels follows the eager step on e3nn's."""
    from alchemi_mace.random_model import mace_mp_small_like

    net = mace_mp_small_like(seed=2, channels=32, max_ell=2, dtype=torch.float32)
    batch = Batch.from_atoms(copper_cells(3), dtype=torch.float32, device="cuda")
    cueq = MaceModel(net, dtype="float32", enable_cueq=True)
    e3nn = MaceModel(mace_mp_small_like(seed=2, channels=32, max_ell=2, dtype=torch.float32), dtype="float32",
                     enable_cueq=False)
    _, graphed, captures = eager_and_captured(cueq, batch.clone())
    eager, _, _ = eager_and_captured(e3nn, batch.clone())
    assert captures >= 1 and cueq.uses_cueq and not e3nn.uses_cueq
    # Different kernels sum in different orders: float32 rounding, grown over 30 steps (a wrong
    # conversion differs by whole eV/Å).
    torch.testing.assert_close(graphed.forces, eager.forces, rtol=0, atol=1e-3)
    torch.testing.assert_close(graphed.positions, eager.positions, rtol=0, atol=1e-4)


def test_captured_step_equals_eager(tiny_net):
    model = MaceModel(tiny_net, dtype="float64", enable_cueq=False)
    eager, graphed, captures = eager_and_captured(model, Batch.from_atoms(copper_cells(3), dtype=torch.float64,
                                                                            device="cuda"))
    assert captures >= 1
    torch.testing.assert_close(graphed.positions, eager.positions, rtol=0, atol=1e-8)
    torch.testing.assert_close(graphed.forces, eager.forces, rtol=0, atol=1e-8)


def test_captured_steps_allocate_nothing_and_eager_steps_take_no_new_memory():
    from alchemi_mace.random_model import mace_mp_small_like

    model = MaceModel(mace_mp_small_like(seed=0, dtype=torch.float32), dtype="float32")
    batch = Batch.from_atoms(copper_cells(4), dtype=torch.float32, device="cuda")
    allocations, segments = step_allocations(langevin(model, 1000).compile(), batch.clone())
    assert allocations == 0 and segments == 0
    _, segments = step_allocations(langevin(model, 1000), batch.clone())
    assert segments == 0  # eager temporaries come from the caching allocator, no cudaMalloc


@pytest.mark.parametrize("inflight", [False, True], ids=["fused", "inflight"])
def test_fire_then_langevin_compiled(tiny_net, inflight):
    model = MaceModel(tiny_net, dtype="float32")
    relax_then_md(model, copper_cells(3) + reference_structures()[:2], torch.float32, inflight=inflight,
                  fire_steps=40, md_steps=40, device="cuda", compiled=True)


def test_measured_bytes_per_atom_plan_batches():
    from alchemi_mace.random_model import mace_mp_small_like

    model = MaceModel(mace_mp_small_like(seed=0, dtype=torch.float32), dtype="float32")
    estimate = model.bytes_per_atom()
    measured = model.measure_bytes_per_atom(Batch.from_atoms(copper_cells(8), dtype=torch.float32, device="cuda"))
    assert 0 < measured == model.bytes_per_atom()
    print(f"MACE-MP-0-small shape, float32: estimate {estimate:.3g} B/atom, measured {measured:.3g} B/atom")


def test_captured_chunked_step_equals_the_eager_whole_batch(tiny_net):
    """Three cells in chunks of one cell, the step captured: the whole batch's eager run."""
    batch = Batch.from_atoms(copper_cells(3), dtype=torch.float64, device="cuda")
    whole, _, _ = eager_and_captured(MaceModel(tiny_net, dtype="float64", enable_cueq=False), batch)
    _, graphed, captures = eager_and_captured(MaceModel(tiny_net, dtype="float64", enable_cueq=False,
                                                        chunk_atoms=108), batch)
    assert captures >= 1
    torch.testing.assert_close(graphed.positions, whole.positions, rtol=0, atol=1e-8)
    torch.testing.assert_close(graphed.forces, whole.forces, rtol=0, atol=1e-8)


def test_chunks_hold_one_chunks_activations():
    """A forward and backward of 32 cells in chunks of 4 peaks well below the whole batch's, and
    a captured chunked step still allocates nothing."""
    from alchemi_mace.random_model import mace_mp_small_like

    net = mace_mp_small_like(seed=0, dtype=torch.float32)
    batch = Batch.from_atoms(copper_cells(32), dtype=torch.float32, device="cuda")
    peaks = {}
    for chunk in (None, 4 * 108):
        model = MaceModel(net, dtype="float32", enable_cueq=False, chunk_atoms=chunk)
        model(batch, compute_stress=True)  # warm: edges, windows
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = model(batch, compute_stress=True)
        torch.cuda.synchronize()
        peaks[chunk] = torch.cuda.max_memory_allocated() - base
        if chunk is None:
            whole = out
        else:
            torch.testing.assert_close(out["forces"], whole["forces"], rtol=0, atol=2e-5)
            torch.testing.assert_close(out["stress"], whole["stress"], rtol=0, atol=1e-6)
        del model, out
        torch.cuda.empty_cache()
    print(f"32 cells, MACE-MP-0-small shape: whole {peaks[None] / 2**20:.0f} MiB, chunks of 4 cells "
          f"{peaks[432] / 2**20:.0f} MiB")
    assert peaks[432] < 0.3 * peaks[None]
    chunked = MaceModel(net, dtype="float32", chunk_atoms=4 * 108)
    allocations, segments = step_allocations(langevin(chunked, 1000).compile(), batch.clone())
    assert allocations == 0 and segments == 0
