"""``alchemi_core.evaluate`` and ``relax`` with the Lennard-Jones model: input order, results equal
to the model on each structure alone, relaxations below ``fmax``, and the Frechet cell filter's
minima equal to ASE's FIRE on a ``FrechetCellFilter``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("ase")
pytest.importorskip("alchemi_potentials")
pytest.importorskip("alchemi_integrators")

from ase import Atoms  # noqa: E402
from ase.build import bulk  # noqa: E402

from alchemi_core import evaluate, registry, relax  # noqa: E402
from alchemi_core.data import Batch  # noqa: E402

ARGON = {"epsilon": 0.0104, "sigma": 3.405, "cutoff": 8.5125, "shift_energy": True}


def _lj():
    return registry.build("model:lennard-jones", **ARGON)


def _cells(strains=(0.97, 1.03, 1.0), rattle=0.05) -> list[Atoms]:
    out = []
    for s, strain in enumerate(strains):
        a = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((2, 2, 2 + s % 2))
        a.rattle(rattle, seed=s)
        a.set_cell(a.cell * strain, scale_atoms=True)
        out.append(a)
    return out


def _cluster(n: int, seed: int) -> Atoms:
    """``n`` argon atoms on a jittered grid 3.8 Å apart, no cell."""
    rng = np.random.default_rng(seed)
    grid = np.array([(i, j, k) for i in range(3) for j in range(3) for k in range(3)][:n], dtype=float)
    return Atoms(f"Ar{n}", positions=3.8 * grid + rng.normal(scale=0.1, size=(n, 3)))


def test_evaluate_a_mixed_set_equals_the_model_on_each_alone() -> None:
    structures = [_cells()[0], _cluster(5, 1), _cells()[1], _cluster(13, 2), _cells()[2], _cluster(2, 3)]
    done = evaluate(structures, _lj(), dtype=torch.float64, max_atoms=60)
    assert [len(a) for a in done] == [len(a) for a in structures]
    assert [a.info["system_id"] for a in done] == list(range(len(structures)))
    for a, given in zip(done, structures, strict=True):
        ref = _lj()(Batch.from_atoms([given], dtype=torch.float64))
        assert a.get_potential_energy() == pytest.approx(float(ref["energy"]), rel=0, abs=1e-12)
        np.testing.assert_allclose(a.get_forces(), ref["forces"].numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(a.positions, given.positions, rtol=0, atol=0)


def test_evaluate_gives_stress_when_asked() -> None:
    cells = _cells()
    done = evaluate(cells, _lj(), compute_stress=True, dtype=torch.float64)
    for a, given in zip(done, cells, strict=True):
        ref = _lj()(Batch.from_atoms([given], dtype=torch.float64), compute_stress=True)
        np.testing.assert_allclose(a.get_stress(voigt=False), ref["stress"][0].numpy(), rtol=0, atol=1e-12)


def test_relax_returns_every_structure_in_order_below_fmax() -> None:
    structures = [_cluster(5, 1), *_cells(rattle=0.1), _cluster(8, 4)]
    done = relax(structures, _lj(), fmax=0.01, max_steps=2000, dtype=torch.float64, dt=5.0, max_atoms=80)
    assert [len(a) for a in done] == [len(a) for a in structures]
    assert [a.info["system_id"] for a in done] == list(range(len(structures)))
    steps = [a.info["steps"] for a in done]
    assert all(a.info["converged"] for a in done), [a.info for a in done]
    for a in done:
        assert np.linalg.norm(a.get_forces(), axis=1).max() <= 0.01
        assert a.info["fmax"] == pytest.approx(np.linalg.norm(a.get_forces(), axis=1).max(), abs=1e-12)
    assert 0 < min(steps) < max(steps) < 2000  # each stopped at its own step


def test_relax_out_of_steps_is_not_converged() -> None:
    done = relax(_cells(rattle=0.2)[:2], _lj(), fmax=1e-6, max_steps=3, dtype=torch.float64)
    assert [a.info["converged"] for a in done] == [False, False]
    assert [a.info["steps"] for a in done] == [3, 3]


@pytest.mark.slow  # ASE's FrechetCellFilter steps take ~0.1 s each (SciPy's matrix logarithm)
def test_relax_with_the_frechet_filter_reaches_ases_minimum() -> None:
    from ase.calculators.lj import LennardJones
    from ase.filters import FrechetCellFilter
    from ase.optimize import FIRE

    starts = _cells(strains=(0.97, 1.03))[:2]
    fmax = 1e-3
    done = relax(starts, _lj(), fmax=fmax, cell_filter="frechet", max_steps=3000, dtype=torch.float64)
    for a, start in zip(done, starts, strict=True):
        assert a.info["converged"] and a.info["fmax"] <= fmax
        ref = start.copy()
        ref.calc = LennardJones(epsilon=ARGON["epsilon"], sigma=ARGON["sigma"], rc=ARGON["cutoff"], smooth=False)
        FIRE(FrechetCellFilter(ref), logfile=None).run(fmax=fmax, steps=3000)
        assert a.get_potential_energy() / len(a) == pytest.approx(ref.get_potential_energy() / len(ref), abs=2e-6)
        assert a.get_volume() == pytest.approx(ref.get_volume(), rel=2e-3)
        # The cell moved to LJ's own minimum: the filter's fmax counts the cell (stress near zero).
        assert np.abs(a.get_stress()).max() < 1e-4


def test_the_log_shows_the_cell_filters_fmax() -> None:
    """Under a cell filter the logged fmax counts the cell's forces, as convergence does."""
    from alchemi_core.dynamics import ConvergenceHook
    from alchemi_hooks.logger import LoggingHook
    from alchemi_integrators.cell_filter import CELL_FILTER_FMAX

    rows = []
    log = LoggingHook(writer=rows.append, frequency=1)
    batch = Batch.from_atoms(_cells(strains=(0.95, 1.0), rattle=0.0)[:2], dtype=torch.float64)
    fire = registry.build("integrator:fire", model=_lj(), n_steps=4, cell_filter="frechet", hooks=[log],
                          convergence_hook=ConvergenceHook.from_fmax(1e-6))
    fire.run(batch)
    last = rows[-1]
    np.testing.assert_allclose(last["fmax"], getattr(batch, CELL_FILTER_FMAX).numpy(), rtol=0, atol=1e-12)
    atoms_only = torch.linalg.vector_norm(batch.forces, dim=-1).max().item()
    assert atoms_only < 1e-8 < last["fmax"][0]  # unrattled: no atomic force, but the strained cell's


def test_relax_stops_evaluating_what_converged() -> None:
    """The model evaluates about one system per FIRE step taken (a refill re-evaluates the batch
    once for its newcomers), where one batch run to its slowest member evaluates all at every step."""
    from alchemi_core.testing.factories import rattled_argon

    model = _lj()
    evaluated = [0]
    forward = model.forward

    def counting(batch, *args, **kwargs):  # type: ignore[no-untyped-def]
        evaluated[0] += batch.num_graphs
        return forward(batch, *args, **kwargs)

    model.forward = counting
    cells = rattled_argon(16, 0.02, 0.01)
    done = relax(cells, model, fmax=0.01, dtype=torch.float64, max_batch_size=8)
    steps = [a.info["steps"] for a in done]
    assert all(a.info["converged"] for a in done)
    assert evaluated[0] <= 1.2 * sum(steps)
    assert sum(steps) < 0.8 * len(cells) * max(steps)  # what one batch to the slowest would cost
