"""Phonons through phonopy with alchemi's batched evaluation, against phonopy's own ASE route.

The reference is phonopy's documented ASE workflow: its displacements, forces from the ASE
calculator one supercell at a time, ``produce_force_constants``. The models on the alchemi side:
ASE's EMT (Cu, Al, Ni) and ASE's Tersoff with Tersoff's Si(B) parameters (Si), both through
``model:ase``, and alchemi's own Warp Lennard-Jones for argon against ASE's ``LennardJones``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk, molecule
from ase.calculators.emt import EMT
from ase.calculators.lj import LennardJones as AseLennardJones
from ase.calculators.tersoff import Tersoff, TersoffParameters

from alchemi_core import registry
from alchemi_core.errors import ConfigurationError

phonopy = pytest.importorskip("phonopy")
from alchemi_properties.phonons import PhononFailure, phonons  # noqa: E402

FC_TOL = 1e-6  # eV/Å², the bound on force constants
EPS, SIG, RC = 0.0104, 3.405, 8.5125  # argon
# Tersoff, PRB 38, 9902 (1988), Si(B), as in LAMMPS' Si.tersoff: m gamma lambda3 c d h n beta lambda2 B R D lambda1 A
SI_TERSOFF = [3.0, 1.0, 1.3258, 4.8381, 2.0417, 0.0, 22.956, 0.33675, 1.3258, 95.373, 3.0, 0.2, 3.2394, 3264.7]


def tersoff() -> Tersoff:
    return Tersoff({("Si", "Si", "Si"): TersoffParameters.from_list(SI_TERSOFF)})


def lennard_jones(**options):
    return registry.build("model:lennard-jones", epsilon=EPS, sigma=SIG, cutoff=RC, shift_energy=True, **options)


def phonopy_ase_route(atoms, calculator, supercell_matrix, mesh=None, temperatures=None):
    """phonopy's own calculation through ASE: one supercell at a time on the calculator."""
    from phonopy.structure.atoms import PhonopyAtoms

    unitcell = PhonopyAtoms(symbols=atoms.get_chemical_symbols(), cell=atoms.cell[:],
                            scaled_positions=atoms.get_scaled_positions(), masses=atoms.get_masses())
    ph = phonopy.Phonopy(unitcell, supercell_matrix=supercell_matrix)
    ph.generate_displacements(distance=0.01)
    forces = []
    for sc in ph.supercells_with_displacements:
        displaced = Atoms(sc.symbols, cell=sc.cell, scaled_positions=sc.scaled_positions, pbc=True)
        displaced.calc = calculator
        forces.append(displaced.get_forces())
    ph.forces = forces
    ph.produce_force_constants()
    if mesh is not None:
        ph.run_mesh(mesh)
        ph.run_total_dos()
        ph.run_thermal_properties(temperatures=temperatures)
    return ph


def assert_fc_close(result, reference, what):
    assert result.failure is None, f"{what}: {result.failure}"
    fc, ref = result.force_constants, reference.force_constants
    assert fc.shape == ref.shape, what
    assert np.abs(ref).max() > 0.1, f"{what}: no force constants to compare"
    np.testing.assert_allclose(fc, ref, rtol=0, atol=FC_TOL, err_msg=what)


@pytest.mark.parametrize(
    ("name", "atoms", "calculator", "supercell"),
    [
        ("Si diamond, Tersoff", bulk("Si", "diamond", a=5.43), tersoff, [2, 2, 2]),
        ("Cu fcc, EMT", bulk("Cu", "fcc", a=3.6), EMT, [3, 3, 3]),
    ],
    ids=["Si", "Cu"],
)
def test_force_constants_equal_phonopy_through_ase(name, atoms, calculator, supercell):
    """float64, model:ase on the same calculator: force constants, DOS and thermal properties equal
    phonopy's own ASE route."""
    model = registry.build("model:ase", calculator())
    [result] = phonons([atoms], model, supercell_matrix=supercell, mesh=[9, 9, 9],
                       temperatures=[100.0, 300.0, 600.0], dtype=torch.float64)
    reference = phonopy_ase_route(atoms, calculator(), supercell, mesh=[9, 9, 9],
                                  temperatures=[100.0, 300.0, 600.0])
    assert_fc_close(result, reference, name)
    assert result.supercells == len(reference.supercells_with_displacements)
    np.testing.assert_allclose(result.total_dos.dos, reference.total_dos.dos, rtol=1e-6, atol=1e-8)
    for key in ("free_energy", "entropy", "heat_capacity"):
        got, want = getattr(result.thermal_properties, key), getattr(reference.thermal_properties, key)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9, err_msg=f"{name} {key}")
    assert np.all(result.thermal_properties.heat_capacity > 0)


def test_alchemi_lennard_jones_equals_ase_lennard_jones():
    """alchemi's own Warp LJ, batched over several crystals, against ASE's LennardJones per supercell."""
    rattled = bulk("Ar", "fcc", a=5.26, cubic=True)
    rattled.rattle(0.05, seed=2)  # no symmetry: 24 displaced supercells, each with its own forces
    crystals = [bulk("Ar", "fcc", a=a) for a in (5.20, 5.26, 5.32)] + [bulk("Ar", "bcc", a=4.2), rattled]
    results = phonons(crystals, lennard_jones(), supercell_matrix=[2, 2, 2], dtype=torch.float64)
    assert results[-1].supercells == 24
    for a, result in zip(crystals, results, strict=True):
        reference = phonopy_ase_route(a, AseLennardJones(epsilon=EPS, sigma=SIG, rc=RC, smooth=False), [2, 2, 2])
        assert_fc_close(result, reference, f"Ar {a.cell.cellpar()[0]:.2f}")


def test_several_structures_in_one_call_equal_each_alone():
    """Mixed elements and supercell sizes in one call give what each gives alone."""
    crystals = [bulk("Cu", a=3.6), bulk("Al", a=4.05), bulk("Ni", "fcc", a=3.52, cubic=True), bulk("Cu", a=3.7)]
    sizes = {0: [3, 3, 3], 1: [2, 2, 2], 2: [2, 2, 2], 3: [[-1, 1, 1], [1, -1, 1], [1, 1, -1]]}
    pick = {id(a): sizes[i] for i, a in enumerate(crystals)}
    model = registry.build("model:ase", EMT())
    # No dtype: float64 is the default for a model without floating parameters.
    together = phonons(crystals, model, supercell_matrix=lambda a: pick[id(a)], max_batch_size=2)
    for i, a in enumerate(crystals):
        [alone] = phonons([a], model, supercell_matrix=sizes[i], dtype=torch.float64)
        assert together[i].index == i
        assert together[i].supercells == alone.supercells
        np.testing.assert_allclose(together[i].force_constants, alone.force_constants, rtol=0, atol=1e-12)


def test_every_displaced_supercell_evaluated_once():
    """The model sees each displaced supercell of each structure exactly once."""
    seen = []

    class CountingEMT(EMT):
        def calculate(self, *args, **kwargs):
            super().calculate(*args, **kwargs)
            seen.append(len(self.atoms))

    nial = Atoms("NiAl", scaled_positions=[[0, 0, 0], [0.5, 0.5, 0.5]], cell=np.eye(3) * 2.88, pbc=True)  # B2
    rattled = bulk("Cu", "fcc", a=3.6, cubic=True)
    rattled.rattle(0.02, seed=1)  # no symmetry left: every atom displaced along +-x, y, z
    crystals = [bulk("Cu", a=3.6), nial, rattled]
    results = phonons(crystals, registry.build("model:ase", CountingEMT()), supercell_matrix=[2, 2, 2],
                      dtype=torch.float64)
    expected = [len(r.phonopy.supercells_with_displacements) for r in results]
    assert [r.supercells for r in results] == expected
    assert expected[0] == 1 and expected[1] > 1 and expected[2] == 24
    assert sorted(seen) == sorted(len(r.phonopy.supercell) for r in results for _ in range(r.supercells))


def test_failures_are_reported_with_their_reason_and_the_rest_finish():
    """A supercell the model cannot evaluate, a structure that is not a crystal: both reported."""
    argon = bulk("Ar", "fcc", a=5.26)
    structures = [argon, bulk("Cu", a=3.6), molecule("H2O")]
    results = phonons(structures, lennard_jones(species=(18,)), supercell_matrix=[2, 2, 2], dtype=torch.float64)
    assert [r.index for r in results] == [0, 1, 2]
    [alone] = phonons([argon], lennard_jones(species=(18,)), supercell_matrix=[2, 2, 2], dtype=torch.float64)
    np.testing.assert_allclose(results[0].force_constants, alone.force_constants, rtol=0, atol=1e-12)
    assert "displaced supercell 0" in results[1].failure and "[29]" in results[1].failure
    assert results[1].force_constants is None
    assert "periodic" in results[2].failure and results[2].phonopy is None
    with pytest.raises(PhononFailure, match="structure 1"):
        phonons(structures[:2], lennard_jones(species=(18,)), supercell_matrix=[2, 2, 2], strict=True)


def test_non_finite_forces_fail_their_structure_only():
    """A supercell whose forces come back NaN (found by the run's quarantine) fails its structure."""

    class NanForAluminium(EMT):
        def calculate(self, *args, **kwargs):
            super().calculate(*args, **kwargs)
            if 13 in self.atoms.numbers:
                self.results["forces"] = np.full_like(self.results["forces"], np.nan)

    crystals = [bulk("Cu", a=3.6), bulk("Al", a=4.05), bulk("Ni", a=3.52)]
    results = phonons(crystals, registry.build("model:ase", NanForAluminium()), supercell_matrix=[2, 2, 2],
                      dtype=torch.float64)
    assert results[1].failure is not None and "displaced supercell 0" in results[1].failure
    assert "finite" in results[1].failure, results[1].failure
    assert results[1].force_constants is None and results[1].supercells == 1
    [cu] = phonons(crystals[:1], registry.build("model:ase", EMT()), supercell_matrix=[2, 2, 2], dtype=torch.float64)
    np.testing.assert_array_equal(results[0].force_constants, cu.force_constants)
    assert results[2].failure is None


def test_band_structure_on_a_given_path_equals_phonopys():
    path = [[[0.0, 0.0, 0.0], [0.5, 0.0, 0.5], [0.5, 0.25, 0.75]], [[0.0, 0.0, 0.0], [0.5, 0.5, 0.5]]]
    cu = bulk("Cu", a=3.6)
    [result] = phonons([cu], registry.build("model:ase", EMT()), supercell_matrix=[3, 3, 3], band_path=path,
                       band_points=21, dtype=torch.float64)
    reference = phonopy_ase_route(cu, EMT(), [3, 3, 3])
    from phonopy.phonon.band_structure import get_band_qpoints

    reference.run_band_structure(get_band_qpoints(path, npoints=21))
    got, want = result.band_structure.frequencies, reference.band_structure.frequencies
    assert [f.shape for f in got] == [(21, 3), (21, 3), (21, 3)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    assert np.abs(got[0][0]).max() < 1e-2  # acoustic modes vanish at Gamma (THz)


def test_band_structure_and_dos_plot_is_a_real_picture(tmp_path):
    pytest.importorskip("seekpath")
    image = pytest.importorskip("matplotlib.image")
    results = phonons([bulk("Cu", a=3.6), bulk("Al", a=4.05)], registry.build("model:ase", EMT()),
                      supercell_matrix=[2, 2, 2], band_path="auto", mesh=[7, 7, 7], plot_dir=tmp_path / "plots",
                      dtype=torch.float64)
    for r in results:
        assert r.plot == tmp_path / "plots" / f"phonons-{r.index}.png"
        data = r.plot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(data) > 10_000
        pixels = image.imread(r.plot)
        assert pixels.shape[0] > 100 and pixels.shape[1] > 100
        assert pixels[..., :3].std() > 0.05, "a blank picture"
        assert r.band_structure.labels  # seekpath's path, labelled
    assert results[0].plot.read_bytes() != results[1].plot.read_bytes()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"temperatures": [300.0]}, "mesh"),
        ({"plot_dir": "x"}, "band_path"),
        ({"band_path": "gamma"}, "band_path"),
    ],
)
def test_options_that_do_not_go_together_are_refused(options, match):
    with pytest.raises(ConfigurationError, match=match):
        phonons([bulk("Cu", a=3.6)], registry.build("model:ase", EMT()), **options)
    with pytest.raises(ConfigurationError, match="no structures"):
        phonons([], registry.build("model:ase", EMT()))


def test_worker_processes_give_what_one_process_gives(tmp_path):
    """phonopy's work spread over processes: the same force constants, properties and plots, in order."""
    crystals = [bulk("Cu", a=3.6), bulk("Al", a=4.05), molecule("H2O"), bulk("Ni", a=3.52)]
    options = {"supercell_matrix": [2, 2, 2], "band_path": [[[0, 0, 0], [0.5, 0, 0.5]]], "band_points": 11,
               "mesh": [5, 5, 5], "temperatures": [300.0], "dtype": torch.float64}
    model = registry.build("model:ase", EMT())
    serial = phonons(crystals, model, plot_dir=tmp_path / "one", **options)
    spread = phonons(crystals, model, plot_dir=tmp_path / "two", workers=2, **options)
    assert [r.index for r in spread] == [0, 1, 2, 3]
    assert spread[2].failure == serial[2].failure and "periodic" in spread[2].failure
    for one, two in zip(serial[:2] + serial[3:], spread[:2] + spread[3:], strict=True):
        assert two.failure is None and two.supercells == one.supercells
        np.testing.assert_array_equal(two.force_constants, one.force_constants)
        np.testing.assert_array_equal(two.thermal_properties.free_energy, one.thermal_properties.free_energy)
        np.testing.assert_array_equal(two.band_structure.frequencies[0], one.band_structure.frequencies[0])
        assert two.plot == tmp_path / "two" / f"phonons-{two.index}.png" and two.plot.stat().st_size > 10_000
    with pytest.raises(ConfigurationError, match="workers"):
        phonons(crystals, model, workers=0)


@pytest.mark.gpu
def test_on_the_gpu_force_constants_equal_phonopy_through_ase():
    """On a GPU (alchemi's Warp LJ on CUDA, float64, many crystals in one run): phonopy's ASE route's
    force constants within 1e-6 eV/Å²."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    crystals = [bulk("Ar", "fcc", a=5.20 + 0.02 * k) for k in range(8)] + [bulk("Ar", "bcc", a=4.2)]
    results = phonons(crystals, lennard_jones(), supercell_matrix=[3, 3, 3], device="cuda", dtype=torch.float64,
                      workers=2)
    for a, result in zip(crystals, results, strict=True):
        reference = phonopy_ase_route(a, AseLennardJones(epsilon=EPS, sigma=SIG, rc=RC, smooth=False), [3, 3, 3])
        assert_fc_close(result, reference, f"Ar {a.cell.cellpar()[0]:.2f} on cuda")
