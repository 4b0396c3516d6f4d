"""The "Done when" lines with a machine-learned potential: 7net-0 (``model:sevennet``, float32),
against sevenn's own ASE calculator. They run where sevenn is installed (its own environment,
``.venv-sevennet``, with this plugin on the path) and there is a CUDA GPU: on two CPU cores they
take many minutes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.eos import EquationOfState

from alchemi_core import registry
from alchemi_properties import elastic_tensor, equation_of_state

pytest.importorskip("sevenn")
pytest.importorskip("alchemi_sevennet")

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DEVICE = "cuda"


def _calculator(device: str):
    from sevenn.calculator import SevenNetCalculator

    return SevenNetCalculator("7net-0", device=device)


def test_eos_of_twenty_copper_crystals_equals_ases_fits():
    model = registry.build("model:sevennet").to(DEVICE)
    crystals = [bulk("Cu", "fcc", a=a) for a in np.linspace(3.58, 3.66, 10)]
    crystals += [bulk("Cu", "fcc", a=a, cubic=True) for a in np.linspace(3.58, 3.66, 10)]
    results = equation_of_state(crystals, model, dtype=torch.float32)
    calc = _calculator(DEVICE)
    for r, atoms in zip(results, crystals, strict=True):
        assert r.error is None, r.error
        # ASE's EquationOfState on the same energies gives the same fit.
        v0, _, b0 = EquationOfState(list(r.volumes), list(r.energies), eos="birchmurnaghan").fit(warn=False)
        assert r.v0 == pytest.approx(v0, rel=1e-6) and r.b0 == pytest.approx(b0, rel=1e-6)
        # And the energies are sevenn's own at those volumes (float32).
        theirs = []
        for volume in r.volumes:
            scaled = atoms.copy()
            scaled.set_cell(atoms.cell * (volume / atoms.get_volume()) ** (1 / 3), scale_atoms=True)
            scaled.calc = calc
            theirs.append(scaled.get_potential_energy())
        np.testing.assert_allclose(r.energies, theirs, atol=2e-4 * len(atoms))
        v0, _, b0 = EquationOfState(list(r.volumes), theirs, eos="birchmurnaghan").fit(warn=False)
        assert r.v0 == pytest.approx(v0, rel=1e-4) and r.b0 == pytest.approx(b0, rel=1e-2)


def test_elastic_constants_of_copper_and_silicon_with_one_model_equal_ases():
    from ase.optimize import BFGS

    model = registry.build("model:sevennet").to(DEVICE)
    crystals = [bulk("Cu", "fcc", a=3.62, cubic=True), bulk("Si", "diamond", a=5.45, cubic=True)]
    results = elastic_tensor(crystals, model, dtype=torch.float32, fmax=1e-3)
    calc = _calculator(DEVICE)
    pairs = [(0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1)]
    for r, atoms in zip(results, crystals, strict=True):
        assert r.error is None, r.error
        reference = np.zeros((6, 6))
        for j, (k, m) in enumerate(pairs):
            stresses = []
            for e in (-0.01, 0.01):
                deformation = np.eye(3)
                deformation[k, m] += e if k == m else e / 2
                if k != m:
                    deformation[m, k] += e / 2
                strained = atoms.copy()
                strained.set_cell(strained.cell[:] @ deformation, scale_atoms=True)
                strained.calc = calc
                BFGS(strained, logfile=None).run(fmax=1e-3, steps=1000)
                stresses.append(strained.get_stress(voigt=True))
            reference[:, j] = (stresses[1] - stresses[0]) / 0.02 * 160.21766208
        c, ref = r.tensor, reference
        for value, expected in ((c[0, 0], ref[0, 0]), (c[0, 1], ref[0, 1]), (c[3, 3], ref[3, 3])):
            assert value == pytest.approx(expected, rel=0.01)
        for block in (np.diag(c)[:3], c[[0, 0, 1], [1, 2, 2]], np.diag(c)[3:]):
            assert np.ptp(block) < 0.01 * c[0, 0], "not cubic within 1 %"
