"""``elastic_tensor`` against a finite-difference calculation done with ASE alone (its own strained
cells, ASE's BFGS relaxing the ions, ASE's stress), cubic symmetry, the Voigt-Reuss-Hill moduli,
warnings and failures."""

from __future__ import annotations

import numpy as np
import pytest
from ase import units
from ase.build import bulk
from ase.optimize import BFGS

from alchemi_properties import elastic_tensor, voigt_reuss_hill


def _ase_tensor(atoms, calculator, strain=0.01, fmax=None):
    """C_ij = d stress_i / d strain_j by central differences, in GPa, with ASE only."""
    pairs = [(0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1)]
    c = np.zeros((6, 6))
    for j, (k, m) in enumerate(pairs):
        stresses = []
        for e in (-strain, strain):
            deformation = np.eye(3)
            deformation[k, m] += e / 2 if k != m else e
            deformation[m, k] += e / 2 if k != m else 0.0
            a = atoms.copy()
            a.set_cell(a.cell[:] @ deformation, scale_atoms=True)
            a.calc = calculator()
            if fmax is not None:
                BFGS(a, logfile=None).run(fmax=fmax, steps=1000)
            stresses.append(a.get_stress(voigt=True))
        c[:, j] = (stresses[1] - stresses[0]) / (2 * strain)
    return c / units.GPa


def _cubic_constants(c):
    """(C11, C12, C44) averaged over their cubic-equivalent elements, and the largest departure from
    cubic symmetry as a fraction of C11."""
    c11, c12, c44 = np.diag(c)[:3], c[[0, 0, 1, 1, 2, 2], [1, 2, 0, 2, 0, 1]], np.diag(c)[3:]
    zeros = np.delete(c.ravel(), [0, 7, 14, 21, 28, 35, 1, 2, 6, 8, 12, 13])
    means = c11.mean(), c12.mean(), c44.mean()
    spread = max(np.ptp(c11), np.ptp(c12), np.ptp(c44), 2 * np.abs(zeros).max()) / means[0]
    return means, spread


@pytest.mark.parametrize(("which", "crystals"), [
    ("emt", [bulk("Cu", "fcc", a=3.59, cubic=True), bulk("Cu", "fcc", a=3.59), bulk("Cu", "fcc", a=3.59) * (1, 2, 1)]),
    pytest.param("tersoff", [bulk("Si", "diamond", a=5.432, cubic=True), bulk("Si", "diamond", a=5.432)],
                 marks=pytest.mark.slow),
], ids=["Cu-EMT", "Si-Tersoff"])
def test_cubic_crystals_equal_ases_finite_differences(which, crystals, request):
    pot = request.getfixturevalue(which)
    results = elastic_tensor(crystals, pot.model, fmax=1e-4)
    reference = _ase_tensor(crystals[0], pot.calculator, fmax=1e-4)
    (r11, r12, r44), ref_spread = _cubic_constants(reference)
    assert ref_spread < 0.01
    for r in results:
        assert r.error is None and r.warnings == ()
        (c11, c12, c44), spread = _cubic_constants(r.tensor)
        assert spread < 0.01, f"not cubic within 1 %: {spread:.2%}"
        assert c11 == pytest.approx(r11, rel=0.01) and c12 == pytest.approx(r12, rel=0.01)
        assert c44 == pytest.approx(r44, rel=0.01)
        moduli = voigt_reuss_hill(r.tensor)
        assert moduli.bulk_hill == pytest.approx((c11 + 2 * c12) / 3, rel=0.01)  # cubic: K = (C11 + 2 C12) / 3
        assert moduli.shear_voigt == pytest.approx((c11 - c12 + 3 * c44) / 5, rel=0.01)


def test_every_element_of_low_symmetry_tensors_equals_ases(emt):
    """A rotated fcc crystal (all 36 elements non-zero) and hcp copper (its ions move under normal
    and xy strains): element by element, so a Voigt component out of order or a wrong shear factor
    shows, which cubic symmetry hides."""
    from scipy.spatial.transform import Rotation

    rotated = bulk("Cu", "fcc", a=3.59)
    rotated.set_cell(rotated.cell[:] @ Rotation.from_euler("zyx", [20, 35, 50], degrees=True).as_matrix().T,
                     scale_atoms=True)
    hcp = bulk("Cu", "hcp", a=2.54, c=4.15)
    results = elastic_tensor([rotated, hcp], emt.model, fmax=1e-4)
    for r, atoms in zip(results, [rotated, hcp], strict=True):
        reference = _ase_tensor(atoms, emt.calculator, fmax=1e-4)
        assert r.error is None
        np.testing.assert_allclose(r.tensor, reference, atol=0.01 * np.abs(reference).max())
    assert np.abs(results[0].tensor).min() > 1.0, "the rotated crystal has no zero element"
    assert abs(results[0].moduli.bulk_hill - voigt_reuss_hill(_ase_tensor(bulk("Cu", "fcc", a=3.59), emt.calculator))
               .bulk_hill) < 0.01 * results[0].moduli.bulk_hill, "rotation leaves the bulk modulus as it is"


@pytest.mark.slow
def test_clamped_ions_equal_ase_exactly_and_relaxing_them_softens_c44(tersoff):
    """Diamond's C44 needs the ions relaxed (Kleinman's internal strain); clamped, it is stiffer."""
    si = bulk("Si", "diamond", a=5.432, cubic=True)
    [clamped] = elastic_tensor([si], tersoff.model, relax_positions=False)
    np.testing.assert_allclose(clamped.tensor, _ase_tensor(si, tersoff.calculator), rtol=1e-6, atol=1e-6)
    [relaxed] = elastic_tensor([si], tersoff.model)
    assert relaxed.tensor[3, 3] < 0.9 * clamped.tensor[3, 3]
    assert relaxed.tensor[0, 0] == pytest.approx(clamped.tensor[0, 0], rel=1e-3)  # no internal strain along xx


def test_voigt_reuss_hill_of_an_isotropic_tensor_is_its_lame_moduli():
    lam, mu = 60.0, 30.0
    c = np.zeros((6, 6))
    c[:3, :3] = lam
    c[range(3), range(3)] = lam + 2 * mu
    c[range(3, 6), range(3, 6)] = mu
    m = voigt_reuss_hill(c)
    for value in (m.bulk_voigt, m.bulk_reuss, m.bulk_hill):
        assert value == pytest.approx(lam + 2 * mu / 3, rel=1e-12)
    for value in (m.shear_voigt, m.shear_reuss, m.shear_hill):
        assert value == pytest.approx(mu, rel=1e-12)


def test_unstable_and_prestressed_crystals_give_warnings(emt):
    bcc = bulk("Cu", "bcc", a=2.87, cubic=True)  # bcc copper is unstable under EMT (C11 < C12)
    stretched = bulk("Cu", "fcc", a=3.59, cubic=True)
    stretched.set_cell(stretched.cell[:] @ np.diag([1.04, 1.0, 1.0]), scale_atoms=True)
    with pytest.warns(UserWarning) as caught:
        unstable, prestressed = elastic_tensor([bcc, stretched], emt.model)
    assert "not positive definite" in unstable.warnings[0] and unstable.tensor[0, 0] < unstable.tensor[0, 1]
    assert any("not symmetric" in w for w in prestressed.warnings)
    assert {str(w.message).split(":")[1].strip() for w in caught} == {"structure 0", "structure 1"}


def test_every_structure_comes_back_once_and_failures_say_why(tersoff):
    si = bulk("Si", "diamond", a=5.432, cubic=True)
    slab = si.copy()
    slab.pbc = (True, True, False)
    results = elastic_tensor([si, slab, si], tersoff.model, max_steps=1)
    assert [r.structure for r in results] == [0, 1, 2]
    assert "periodic in 3 dimensions" in results[1].error
    for r in (results[0], results[2]):
        assert r.tensor is None and "did not relax" in r.error and "strain -yz" in r.error
        assert "strain -xx" not in r.error  # a normal strain leaves diamond's ions where they are


def test_a_model_without_stress_and_a_bad_strain_are_refused(emt):
    from alchemi_core.models.demo import DemoModelWrapper

    with pytest.raises(ValueError, match="gives no stress"):
        elastic_tensor([bulk("Cu")], DemoModelWrapper())
    with pytest.raises(ValueError, match="strain"):
        elastic_tensor([bulk("Cu")], emt.model, strain=0.5)
