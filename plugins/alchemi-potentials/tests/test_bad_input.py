"""Bad input fails early with an error that says what is wrong; never wrong numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ase import Atoms
from ase.build import bulk
from ase.calculators.lj import LennardJones as AseLennardJones

from alchemi_core.data import AtomicData, Batch
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_potentials import LennardJones, Morse
from alchemi_potentials.neighbors import BatchedNeighborList


def argon_and_krypton():
    ar = bulk("Ar", "fcc", a=5.26, cubic=True)
    kr = bulk("Kr", "fcc", a=5.7, cubic=True)
    return Batch.from_atoms([ar, kr], dtype=torch.float64)


def test_unknown_species_named_by_check_batch_and_by_a_direct_call():
    model = LennardJones(epsilon={18: 0.0104}, sigma={18: 3.405}, cutoff=8.5)
    batch = argon_and_krypton()
    with pytest.raises(InvalidDataError, match=r"no parameters for atomic numbers \[36\]; it knows \[18\]"):
        model.check_batch(batch)
    # A direct call makes the checks a run makes (it used to give NaN energies for krypton).
    with pytest.raises(InvalidDataError, match=r"no parameters for atomic numbers \[36\]"):
        model(batch)


def test_a_direct_call_on_a_zero_cell_is_refused_not_zero():
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True)
    atoms.cell[:] = 0.0
    batch = Batch.from_atoms([atoms], dtype=torch.float64)
    with pytest.raises(InvalidDataError, match="zero volume"):
        LennardJones(0.0104, 3.405, 8.5)(batch)


def test_a_direct_call_checks_each_new_batch_once(monkeypatch):
    model = LennardJones(0.0104, 3.405, 8.5)
    calls = []
    real = model.check_batch
    monkeypatch.setattr(model, "check_batch", lambda b: (calls.append(b), real(b))[1])
    batch = Batch.from_atoms([bulk("Ar", "fcc", a=5.26, cubic=True)], dtype=torch.float64)
    first = model(batch)["energy"].clone()
    torch.testing.assert_close(model(batch)["energy"], first)
    assert len(calls) == 1 and calls[0] is batch
    # A run changes the batch's version at refills and graduations; the engine checks entering
    # systems itself, so the same batch object is not checked again as a whole.
    version = batch.version
    batch.append(Batch.from_atoms([bulk("Ar", "fcc", a=5.3, cubic=True)], dtype=torch.float64))
    assert batch.version != version
    model(batch)
    assert len(calls) == 1 and calls[0] is batch
    other = Batch.from_atoms([bulk("Ar", "fcc", a=5.26, cubic=True)], dtype=torch.float64)
    model(other)
    assert len(calls) == 2 and calls[1] is other


@pytest.mark.parametrize("thickness", [0.01, 0.02])
def test_a_periodic_cell_thinner_than_the_cutoff_allows_is_refused_in_angstrom(thickness):
    """A 0.01 Å periodic axis used to give E = 0 without a word."""
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True)
    atoms.cell[2] = [0.0, 0.0, thickness]
    batch = Batch.from_atoms([atoms], dtype=torch.float64)
    model = LennardJones(0.0104, 3.405, 8.5)
    for call in (model.check_batch, model):
        with pytest.raises(InvalidDataError, match=rf"only {thickness:g} Å thick across it.*cutoff \+ skin") as err:
            call(batch)
        assert "vector 2" in str(err.value)


def test_a_thin_but_reachable_cell_is_evaluated_like_ase():
    """Thinner than the cutoff is fine while the images fit: a 2.63 Å axis against 8.5 Å."""
    atoms = bulk("Ar", "fcc", a=5.26)  # primitive cell, 3.7 Å vectors, ~3 Å across
    batch = Batch.from_atoms([atoms], dtype=torch.float64)
    out = LennardJones(0.0104, 3.405, 8.5, shift_energy=True)(batch)
    atoms.calc = AseLennardJones(epsilon=0.0104, sigma=3.405, rc=8.5)
    assert out["energy"].item() == pytest.approx(atoms.get_potential_energy(), rel=1e-9)


def test_zero_volume_periodic_cell_is_rejected():
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True)
    flat = atoms.copy()
    flat.set_cell([flat.cell[0], flat.cell[1], flat.cell[0] + flat.cell[1]])
    batch = Batch.from_atoms([atoms, flat], dtype=torch.float64)
    with pytest.raises(InvalidDataError, match=r"systems \[1\] have a periodic cell with zero volume"):
        LennardJones(0.0104, 3.405, 8.5).check_batch(batch)


def test_periodic_axes_without_a_cell_are_rejected():
    data = AtomicData(atomic_numbers=torch.tensor([18, 18]), positions=torch.tensor([[0.0, 0, 0], [3.8, 0, 0]]),
                      pbc=torch.tensor([True, False, False]))
    with pytest.raises(InvalidDataError, match="periodic .* but the batch has no cell"):
        LennardJones(0.0104, 3.405, 8.5).check_batch(Batch.from_data_list([data]))


def test_slab_with_a_zero_open_axis_is_fine():
    """A periodic plane needs only its own two vectors: c = 0 on the open axis is valid (ASE too)."""
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((2, 2, 1))
    atoms.rattle(0.05, seed=2)
    atoms.cell[2] = 0.0
    atoms.pbc = (True, True, False)
    batch = Batch.from_atoms([atoms], dtype=torch.float64)
    model = LennardJones(0.0104, 3.405, 8.5125, shift_energy=True)
    model.check_batch(batch)
    out = model(batch)
    atoms.calc = AseLennardJones(epsilon=0.0104, sigma=3.405, rc=8.5125)
    assert out["energy"].item() == pytest.approx(atoms.get_potential_energy(), rel=1e-9)
    np.testing.assert_allclose(out["forces"].numpy(), atoms.get_forces(), atol=1e-9)
    with pytest.raises(InvalidDataError, match=r"stress was asked of systems \[0\]"):
        model(batch, compute_stress=True)  # no volume, no stress (ASE refuses it too)


def test_open_axis_rows_may_hold_anything():
    """Images use periodic rows only: a wire whose open rows are inf and NaN has the forces of the
    same wire with zero open rows (0 * inf must never reach a displacement)."""
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((1, 1, 2))
    atoms.rattle(0.05, seed=6)
    atoms.pbc = (False, False, True)
    junk = atoms.copy()
    batch = Batch.from_atoms([atoms, junk], dtype=torch.float64)
    batch.cell[0, :2] = 0.0
    batch.cell[1, 0] = float("inf")
    batch.cell[1, 1] = float("nan")
    out = LennardJones(0.0104, 3.405, 8.5125)(batch)
    n = len(atoms)
    assert torch.isfinite(out["forces"]).all() and torch.isfinite(out["energy"]).all()
    torch.testing.assert_close(out["forces"][n:], out["forces"][:n], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(out["energy"][1], out["energy"][0], rtol=1e-12, atol=0.0)


def test_cutoff_beyond_the_neighbour_list():
    with pytest.raises(ConfigurationError, match="larger than the 5.0 Å its neighbour list was built for"):
        LennardJones(0.0104, 3.405, 8.5, neighbor_list=BatchedNeighborList(5.0))
    model = LennardJones(0.0104, 3.405, 8.5)
    model.neighbor_list = BatchedNeighborList(6.0)  # swapped for a shorter list later
    batch = argon_and_krypton().index_select([0])
    with pytest.raises(ConfigurationError, match="larger than the 6.0 Å"):
        model.check_batch(batch)
    with pytest.raises(ConfigurationError, match="larger than the 6.0 Å"):
        model(batch)


def test_a_shared_list_may_reach_further():
    shared = BatchedNeighborList(9.0, skin=0.3)
    batch = argon_and_krypton().index_select([0])
    lj = LennardJones(0.0104, 3.405, 8.5, neighbor_list=shared)
    morse = Morse(0.01, 1.2, 3.8, cutoff=7.0, neighbor_list=shared)
    alone = LennardJones(0.0104, 3.405, 8.5)(batch)
    torch.testing.assert_close(lj(batch)["forces"], alone["forces"])
    torch.testing.assert_close(morse(batch)["energy"], Morse(0.01, 1.2, 3.8, cutoff=7.0)(batch)["energy"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"epsilon": -0.01, "sigma": 3.4, "cutoff": 8.0}, "epsilon must be positive"),
        ({"epsilon": 0.01, "sigma": 3.4, "cutoff": 0.0}, "cutoff must be positive"),
        ({"epsilon": {18: 0.01}, "sigma": {18: 3.4, 36: 3.6}, "cutoff": 8.0}, "must list the same elements"),
        ({"epsilon": 0.01, "sigma": 3.4, "cutoff": 8.0, "mixing": "sixth-power"}, "unknown mixing rule"),
        ({"epsilon": 0.01, "sigma": 3.4, "cutoff": 8.0, "shift_energy": True, "switch_onset": 7.0}, "choose one"),
        ({"epsilon": 0.01, "sigma": 3.4, "cutoff": 8.0, "switch_onset": 8.0}, "switch_onset must lie"),
        ({"epsilon": {18: 0.01}, "sigma": {18: 3.4}, "cutoff": 8.0, "pair_epsilon": {(18, 36): 0.1}},
         "names element 36, which has no parameters"),
        ({"epsilon": 0.01, "sigma": 3.4, "cutoff": 8.0, "pair_sigma": {(18, 36): 3.5}}, "needs per-element tables"),
        ({"epsilon": 0.01, "sigma": 3.4, "cutoff": 8.0, "skin": 0.3, "neighbor_list": BatchedNeighborList(8.0)},
         "belong to the neighbour list"),
        ({"epsilon": 0.01, "sigma": 3.4, "cutoff": 8.0, "skin": -1.0}, "skin >= 0"),
        ({"epsilon": 0.01, "sigma": {"Xx": 3.4}, "cutoff": 8.0}, "unknown element 'Xx'"),
    ],
)
def test_bad_parameters_say_what_is_wrong(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        LennardJones(**kwargs)


def test_element_symbols_work_like_atomic_numbers():
    by_symbol = LennardJones(epsilon={"Ar": 0.0104, "Kr": 0.0141}, sigma={"Ar": 3.405, "Kr": 3.65}, cutoff=8.5)
    by_number = LennardJones(epsilon={18: 0.0104, 36: 0.0141}, sigma={18: 3.405, 36: 3.65}, cutoff=8.5)
    batch = argon_and_krypton()
    torch.testing.assert_close(by_symbol(batch)["energy"], by_number(batch)["energy"], rtol=0, atol=0)


def test_half_precision_positions_are_rejected():
    batch = Batch.from_data_list([AtomicData(atomic_numbers=torch.tensor([18]), positions=torch.zeros(1, 3, dtype=torch.float16))])
    with pytest.raises(InvalidDataError, match="float32 or float64"):
        LennardJones(0.0104, 3.405, 8.5).check_batch(batch)
    with pytest.raises(InvalidDataError, match="float32 or float64"):
        LennardJones(0.0104, 3.405, 8.5)(batch)


def test_molecule_without_cell_or_pbc():
    """No cell and no pbc: a plain molecule, all pairs within the cutoff."""
    atoms = Atoms("Ar3", positions=[[0, 0, 0], [3.8, 0, 0], [0, 4.1, 0.3]])
    data = AtomicData(atomic_numbers=torch.tensor(atoms.numbers), positions=torch.tensor(atoms.positions))
    batch = Batch.from_data_list([data])
    model = LennardJones(0.0104, 3.405, 8.5)
    model.check_batch(batch)
    out = model(batch)
    r = atoms.get_all_distances()[np.triu_indices(3, 1)]
    expected = (4 * 0.0104 * ((3.405 / r) ** 12 - (3.405 / r) ** 6)).sum()
    assert out["energy"].item() == pytest.approx(expected, rel=1e-12)
    with pytest.raises(InvalidDataError, match=r"stress was asked of systems \[0\] \(system_id \[0\]\) that have no cell"):
        model(batch, compute_stress=True)


def test_cell_measures_of_a_whole_batch_match_each_cell_alone():
    """The checks measure every system at once (a refill may bring thousands); each system's
    widths must be those of its own cell: the plane spacing 1/|reciprocal row| with three
    periodic axes, area over the other row's length with two, the row's length with one."""
    from alchemi_core.data.cells import periodic_measures

    rng = np.random.default_rng(7)
    cells = rng.normal(size=(300, 3, 3)) + 3.0 * np.eye(3)
    pbc = rng.random((300, 3)) < 0.6
    pbc[:3] = [[True, True, True], [True, False, True], [False, True, False]]
    size, _, widths = periodic_measures(cells, pbc)
    for s in range(300):
        axes = np.nonzero(pbc[s])[0]
        rows = cells[s][axes]
        expected = np.full(3, np.inf)
        if len(axes) == 3:
            expected = 1.0 / np.linalg.norm(np.linalg.inv(cells[s]).T, axis=1)
            assert size[s] == pytest.approx(abs(np.linalg.det(cells[s])))
        elif len(axes) == 2:
            area = np.linalg.norm(np.cross(rows[0], rows[1]))
            expected[axes] = [area / np.linalg.norm(rows[1]), area / np.linalg.norm(rows[0])]
            assert size[s] == pytest.approx(area)
        elif len(axes) == 1:
            expected[axes] = np.linalg.norm(rows[0])
        else:
            assert size[s] == 0.0
        np.testing.assert_allclose(widths[s], expected, rtol=1e-10)


def test_a_run_that_needs_stress_refuses_a_molecule_naming_it_before_any_step():
    """Stress of a system without a cell is NaN or infinite: a run that needs stress (a cell
    filter, a barostat) refuses it when it enters, naming it, as a direct call does."""
    from alchemi_core.dynamics import DemoDynamics, Hook
    from alchemi_core.testing import rattled_argon

    class NeedsStress(Hook):
        needs_stress = True

        def __call__(self, batch, dynamics):
            pass

    molecule = Atoms("Ar3", positions=[[0, 0, 0], [3.8, 0, 0], [0, 4.1, 0.3]])
    structures = [AtomicData.from_atoms(a) for a in (*rattled_argon(2, 0.05, 0.0), molecule)]
    batch = Batch.from_data_list(structures)
    batch.set_field("system_id", torch.tensor([40, 41, 42]), "system")
    model = LennardJones(0.0104, 3.405, 8.5)
    stage = DemoDynamics(model=model, n_steps=2, dt=0.5, hooks=[NeedsStress()])
    with pytest.raises(InvalidDataError, match=r"stress was asked of systems \[2\] \(system_id \[42\]\)"):
        stage.run(batch)
    assert torch.isfinite(model(batch)["forces"]).all()  # energy and forces alone are fine


def test_an_edge_model_called_directly_checks_what_a_run_checks():
    """Every edge model (MACE, SevenNet, D3 and the next) refuses on a direct call what a run
    refuses: a periodic cell of zero volume, an atomic number it has no parameters for, one
    that is no element."""
    from alchemi_potentials.edge_model import EdgeModel

    class Springs(EdgeModel):
        def energies(self, batch, positions, cell, edges):
            r2 = (edges.vectors(positions, cell) ** 2).sum(1)
            live = torch.arange(edges.capacity) < edges.count
            per_edge = torch.where(live, r2, torch.zeros_like(r2)) / 4
            return torch.zeros(batch.num_graphs, dtype=r2.dtype).index_add(0, edges.system, per_edge)

    atoms = bulk("Ar", "fcc", a=5.26, cubic=True)
    model = Springs(cutoff=3.0, name="springs", species=(18,))
    assert torch.isfinite(model(Batch.from_atoms([atoms]))["forces"]).all()
    flat = atoms.copy()
    flat.cell[2] = flat.cell[0] + flat.cell[1]
    with pytest.raises(InvalidDataError, match=r"springs: systems \[0\] have a periodic cell with zero volume"):
        model(Batch.from_atoms([flat]))
    for z, message in ((29, r"no parameters for atomic numbers \[29\]; it knows \[18\]"),
                       (119, r"atomic numbers \[119\] are unknown elements")):
        batch = Batch.from_atoms([atoms])
        batch.atomic_numbers[1] = z  # (ASE has no element 119)
        with pytest.raises(InvalidDataError, match=message):
            model(batch)
