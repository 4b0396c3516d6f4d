"""model:aimnet2 on a GPU: equal to aimnet's ASE calculator on the GPU and to itself on the CPU;
FIRE then Langevin runs (fused and inflight)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from alchemi_core.data import Batch

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore:Switching to DSF Coulomb:UserWarning")]

#: float32 on the GPU: energies of 100-400 eV round at about 3e-5 eV; the calculator's atomics
#: sum forces and charges in an order that varies (aimnet's own small molecules take its dense
#: all-pairs layout, alchemi's flat batch its neighbour matrices).
ENERGY_TOL, FORCE_TOL, CHARGE_TOL = 1e-4, 2e-5, 2e-5


def test_gpu_batch_equals_aimnet2_calculator_on_the_gpu(aimnet2, model_path, molecules, water_box):
    from aimnet.calculators import AIMNet2ASE, AIMNet2Calculator

    structures = [*molecules, water_box]
    out = {k: v.cpu() for k, v in aimnet2(Batch.from_atoms(structures, dtype=torch.float32, device="cuda")).items()}
    calc = AIMNet2ASE(AIMNet2Calculator(model_path, device="cuda"))
    ptr = np.concatenate(([0], np.cumsum([len(a) for a in structures])))
    for s, atoms in enumerate(structures):
        a = atoms.copy()
        a.calc = calc
        assert abs(float(out["energy"][s, 0]) - a.get_potential_energy()) < ENERGY_TOL, s
        np.testing.assert_allclose(out["forces"][ptr[s]:ptr[s + 1]].numpy(), a.get_forces(), rtol=0, atol=FORCE_TOL)
        np.testing.assert_allclose(out["charges"][ptr[s]:ptr[s + 1]].numpy(), a.get_charges(), rtol=0,
                                   atol=CHARGE_TOL)


def test_gpu_equals_cpu(model_path, molecules, water_box):
    from alchemi_aimnet import AIMNet2Model

    structures = [*molecules, water_box]
    model = AIMNet2Model(model_path)
    cpu = model(Batch.from_atoms(structures, dtype=torch.float32))
    gpu = model(Batch.from_atoms(structures, dtype=torch.float32, device="cuda"))
    assert gpu["forces"].device.type == "cuda"
    for key, tol in (("energy", ENERGY_TOL), ("forces", FORCE_TOL), ("charges", CHARGE_TOL)):
        torch.testing.assert_close(gpu[key].cpu(), cpu[key], rtol=0, atol=tol)
    box = Batch.from_atoms([water_box], dtype=torch.float32)
    torch.testing.assert_close(model(box.to("cuda"), compute_stress=True)["stress"].cpu(),
                               model(box, compute_stress=True)["stress"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("inflight", [False, True], ids=["fused", "inflight"])
def test_fire_then_langevin(aimnet2, molecules, water_box, inflight):
    from alchemi_potentials.testing import relax_then_md

    relax_then_md(aimnet2, [*molecules, water_box], torch.float32, inflight=inflight, fire_steps=40, md_steps=40,
                  device="cuda")
