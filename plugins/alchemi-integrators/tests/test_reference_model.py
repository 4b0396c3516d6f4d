"""The reference LJ used by the physics tests agrees with ASE's LJ calculator."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from integrators_testkit.lj_reference import ReferenceLJ, argon, ase_lj_calculator

from alchemi_core.data import Batch


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_ase_energies_and_forces(dtype: torch.dtype) -> None:
    # A 1x1x1 cell (5.26 Å) is smaller than twice the cutoff: many images contribute.
    data = [argon(2, rattle=0.1, seed=1, dtype=dtype), argon(1, rattle=0.2, seed=2, dtype=dtype)]
    batch = Batch.from_data_list(data)
    out = ReferenceLJ()(batch)
    assert out["energy"].dtype == dtype and out["forces"].dtype == dtype
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    start = 0
    for i, d in enumerate(data):
        atoms = d.to_atoms()
        atoms.calc = ase_lj_calculator()
        n = len(atoms)
        assert out["energy"][i].item() == pytest.approx(atoms.get_potential_energy(), abs=tol)
        np.testing.assert_allclose(out["forces"][start : start + n].double().numpy(), atoms.get_forces(), atol=tol)
        start += n


def test_pair_list_is_refreshed_when_atoms_move_far() -> None:
    batch = Batch.from_data_list([argon(2, rattle=0.05, seed=0)])
    model = ReferenceLJ(skin=0.4)
    model(batch)
    batch.positions[0] += torch.tensor([0.3, 0.0, 0.0], dtype=torch.float64)  # > skin / 2
    out = model(batch)
    atoms = batch.to_atoms()[0]
    atoms.calc = ase_lj_calculator()
    assert model.rebuilds == 2
    assert out["energy"][0].item() == pytest.approx(atoms.get_potential_energy(), abs=1e-12)
