"""On a CUDA GPU: the Madelung energy, PME equal to Ewald, and steps without host syncs.

References are analytic or GPU-only (the GPU machine's Warp may have no CPU backend)."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.data import Batch
from alchemi_core.testing.gpu import no_host_sync
from alchemi_electrostatics import COULOMB, DSF, PME, Ewald
from alchemi_electrostatics.testing import MADELUNG, NACL_LATTICE, charged_cells

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MODELS = {"ewald": lambda: Ewald(cutoff=8.0, accuracy=1e-8), "pme": lambda: PME(cutoff=8.0, accuracy=1e-8),
          "dsf": lambda: DSF(alpha=0.25, cutoff=15.0)}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_madelung_energy_on_the_gpu_and_a_second_step_without_host_syncs(nacl, name):
    model = MODELS[name]()
    batch = Batch.from_atoms([nacl, nacl.repeat(2)], dtype=torch.float64, device="cuda")
    out = model(batch, compute_stress=True)
    pairs = torch.tensor([4.0, 32.0], dtype=torch.float64, device="cuda")
    expected = -MADELUNG * COULOMB / (NACL_LATTICE / 2)
    torch.testing.assert_close(out["energy"][:, 0] / pairs, torch.full_like(pairs, expected), rtol=1e-6, atol=0)
    with no_host_sync():  # the same systems: setup and edges are kept, nothing is read back
        model(batch, compute_stress=True)


def test_pme_equals_ewald_on_the_gpu_for_random_boxes():
    batch = Batch.from_data_list(charged_cells((2, 1, 2)), device="cuda")
    ewald = MODELS["ewald"]()(batch, compute_stress=True)
    pme = MODELS["pme"]()(batch, compute_stress=True)
    torch.testing.assert_close(pme["energy"], ewald["energy"], rtol=1e-6, atol=0)
    torch.testing.assert_close(pme["forces"], ewald["forces"], rtol=0, atol=1e-5)
