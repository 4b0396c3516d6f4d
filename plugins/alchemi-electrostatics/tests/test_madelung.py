"""Ewald, PME and DSF against the Madelung energy of rock-salt NaCl and against each other."""

from __future__ import annotations

import pytest
import torch

from alchemi_core.data import Batch
from alchemi_electrostatics import COULOMB, DSF, PME, Ewald
from alchemi_electrostatics.testing import MADELUNG, NACL_LATTICE, charged_cells

#: The energy per ion pair: -M e^2 / (4 pi eps0 d), d the nearest-neighbour distance.
PAIR_ENERGY = -MADELUNG * COULOMB / (NACL_LATTICE / 2)


@pytest.mark.parametrize("model", [Ewald(cutoff=8.0, accuracy=1e-8), PME(cutoff=8.0, accuracy=1e-8)],
                         ids=["ewald", "pme"])
def test_ewald_and_pme_give_the_madelung_energy(nacl, model):
    # 1e-6 relative: the constant itself is given to 7 digits (1.7475646 to 8).
    for repeat in (1, 2):  # a conventional cell (4 pairs) and 2x2x2 of them (32 pairs)
        atoms = nacl.repeat(repeat)
        out = model(Batch.from_atoms([atoms], dtype=torch.float64), compute_stress=True)
        pairs = len(atoms) // 2
        assert float(out["energy"]) / pairs == pytest.approx(PAIR_ENERGY, rel=1e-6)
        assert float(out["forces"].abs().max()) < 1e-8  # every ion sits at a centre of symmetry
        pressure = -torch.diagonal(out["stress"][0]).sum() / 3  # E ~ 1/a: -dE/dV = E / 3V
        assert float(pressure) == pytest.approx(float(out["energy"]) / (3 * atoms.get_volume()), rel=1e-6)


def test_dsf_gives_the_madelung_energy_to_what_it_converges_to(nacl):
    # DSF approximates the Ewald sum: 5e-7 relative at alpha = 0.25 1/Å and a 15 Å cutoff; at
    # the defaults (0.2, 12 Å) 1e-3, at (0.3, 10 Å) 3e-5 (docs/models.md).
    batch = Batch.from_atoms([nacl], dtype=torch.float64)
    assert float(DSF(alpha=0.25, cutoff=15.0)(batch)["energy"]) / 4 == pytest.approx(PAIR_ENERGY, rel=1e-6)
    assert float(DSF()(batch)["energy"]) / 4 == pytest.approx(PAIR_ENERGY, rel=1.5e-3)
    assert float(DSF()(batch)["energy"]) / 4 != pytest.approx(PAIR_ENERGY, rel=1e-4)


def test_the_three_agree_on_random_neutral_boxes():
    batch = Batch.from_data_list(charged_cells((2, 1)))
    ewald = Ewald(cutoff=9.0, accuracy=1e-8)(batch, compute_stress=True)
    pme = PME(cutoff=9.0, accuracy=1e-8)(batch, compute_stress=True)
    # Random charges are poorly screened: DSF drops the reciprocal-space sum, which is large
    # here, so it needs a small alpha and a long cutoff (at alpha 0.25 it converges to 25 % off).
    dsf = DSF(alpha=0.1, cutoff=25.0)(batch, compute_stress=True)
    scale = float(ewald["energy"].abs().max())
    torch.testing.assert_close(pme["energy"], ewald["energy"], rtol=0, atol=1e-6 * scale)
    torch.testing.assert_close(pme["forces"], ewald["forces"], rtol=0, atol=1e-5)
    torch.testing.assert_close(pme["stress"], ewald["stress"], rtol=0, atol=1e-7)
    torch.testing.assert_close(dsf["energy"], ewald["energy"], rtol=0, atol=1e-3 * scale)
    torch.testing.assert_close(dsf["forces"], ewald["forces"], rtol=0, atol=2e-3)
    torch.testing.assert_close(dsf["stress"], ewald["stress"], rtol=0, atol=2e-4)
