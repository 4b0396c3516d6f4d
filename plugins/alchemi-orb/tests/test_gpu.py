"""model:orb on a GPU: a full-size orb-v3 network (random weights) equal to ORBCalculator on the
GPU; FIRE with a Frechet filter then Langevin (a compiled stage steps eagerly: ORB's neighbour
search reads back); the per-atom memory estimate the sampler plans with holds."""

from __future__ import annotations

import pytest
import torch
from alchemi_orb import OrbModel
from alchemi_orb.testing import mixed_structures

from alchemi_core.data import Batch
from alchemi_potentials.testing import compare_with_calculator, copper_cells, relax_then_md

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def full_size():
    """``(network, adapter)``: the published orb-v3 conservative architecture, random weights."""
    from orb_models.forcefield import pretrained
    from orb_models.forcefield.forcefield_adapter import ForcefieldAtomsAdapter

    torch.manual_seed(0)
    network = pretrained.orb_v3_conservative_architecture(device="cpu")
    network.prepare_for_inference()
    return network.eval(), ForcefieldAtomsAdapter(radius=6.0, max_num_neighbors=120)


def test_gpu_equals_orb_calculator(full_size):
    from orb_models.forcefield.inference.calculator import ORBCalculator

    network, adapter = full_size
    model = OrbModel(network, atoms_adapter=adapter)
    calc = ORBCalculator(network, adapter, device="cuda")
    compare_with_calculator(model, calc, mixed_structures(), torch.float32, energy_tol=1e-4, force_tol=1e-5,
                            stress_tol=1e-6, device="cuda")


@pytest.mark.parametrize("inflight", [False, True], ids=["fused", "inflight"])
def test_fire_with_a_frechet_filter_then_langevin(full_size, inflight):
    model = OrbModel(*full_size[:1], atoms_adapter=full_size[1])
    periodic = copper_cells(3) + [a for a in mixed_structures() if a.pbc.all()]
    relax_then_md(model, periodic, torch.float32, inflight=inflight, fire_steps=40, md_steps=40, device="cuda",
                  compiled=True, cell_filter="frechet")


def test_the_memory_estimate_covers_a_step(full_size):
    """Peak device memory of a step with stress on 16 W7 cells, per atom, under BYTES_PER_ATOM."""
    model = OrbModel(*full_size[:1], atoms_adapter=full_size[1])
    batch = Batch.from_atoms(copper_cells(16), dtype=torch.float32, device="cuda")
    model(batch, compute_stress=True)  # warm: network on the device, kernels
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    model(batch, compute_stress=True)
    torch.cuda.synchronize()
    per_atom = (torch.cuda.max_memory_allocated() - base) / batch.num_nodes
    print(f"orb-v3 conservative (120 neighbours), float32: {per_atom:.3g} B/atom measured, "
          f"estimate {model.bytes_per_atom():.3g}")
    assert 0 < per_atom < model.bytes_per_atom()
