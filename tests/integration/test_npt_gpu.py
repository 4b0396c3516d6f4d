"""On a GPU: NPT and cell relaxation steps make no host synchronisation and replay as CUDA graphs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from ase.build import bulk

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.testing.gpu import no_host_sync

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# The torch oracles live with the integrators' tests (integrators_testkit/oracles.py).
TESTKIT = Path(__file__).resolve().parents[2] / "plugins" / "alchemi-integrators" / "tests"
if str(TESTKIT) not in sys.path:
    sys.path.insert(0, str(TESTKIT))

CUDA = torch.device("cuda")
EPS, SIG, RC = 0.0104, 3.405, 8.5125


def _cells(n: int = 4, dtype: torch.dtype = torch.float64) -> Batch:
    cells = []
    for seed in range(n):
        atoms = bulk("Ar", "fcc", a=5.30, cubic=True).repeat(3)
        atoms.rattle(0.05, seed=seed)
        cells.append(atoms)
    return Batch.from_atoms(cells, dtype=dtype).to(CUDA)


def _model() -> Any:
    return registry.build("model:lennard-jones", epsilon=EPS, sigma=SIG, cutoff=RC, shift_energy=True)


MAKERS = {
    "npt-mtk": lambda: registry.build("integrator:npt-mtk", model=_model(), dt=5.0, temperature=50.0, tau_p=500.0,
                                      initial_temperature=50.0, random_seed=1),
    "npt-mtk-anisotropic": lambda: registry.build("integrator:npt-mtk", model=_model(), dt=5.0, temperature=50.0,
                                                  tau_p=500.0, anisotropic=True, initial_temperature=50.0,
                                                  random_seed=1),
    "npt-crescale": lambda: registry.build("integrator:npt-crescale", model=_model(), dt=5.0, temperature=50.0,
                                           tau_p=500.0, compressibility=60.0, initial_temperature=50.0,
                                           random_seed=1),
    "fire-frechet": lambda: registry.build("integrator:fire", model=_model(), dt=5.0, cell_filter="frechet"),
    "fire2-unit": lambda: registry.build("integrator:fire2", model=_model(), dt=5.0, cell_filter="unit"),
}


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_a_step_never_synchronises_with_the_host(name: str) -> None:
    batch = _cells()
    dynamics = MAKERS[name]()
    dynamics.step(batch)  # the first step prepares the run (allowed to read back)
    dynamics.step(batch)
    with no_host_sync():
        for _ in range(5):
            dynamics.step(batch)
    assert bool(torch.isfinite(batch.positions).all()) and bool(torch.isfinite(batch.cell).all())


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_captured_step_replays_what_the_eager_step_does(name: str) -> None:
    """The same run eagerly and compiled (captured once, then replayed) ends in the same cell and
    positions: the step's state lives in persistent tensors a replay reads and writes."""
    finals = []
    for compiled in (False, True):
        batch = _cells()
        dynamics = MAKERS[name]()
        if compiled:
            dynamics = dynamics.compile()
        with dynamics:
            dynamics.run(batch, n_steps=60)
        torch.cuda.synchronize()
        if compiled:
            assert dynamics._engine.state.graph_captures >= 1
        finals.append((batch.positions.clone(), batch.cell.clone()))
    (x0, c0), (x1, c1) = finals
    torch.testing.assert_close(c1, c0, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(x1, x0, rtol=1e-9, atol=1e-8)
    assert not torch.allclose(c0, _cells().cell)  # the cell moved


def _captured_runs(kind: str, prepare: Any = None, **options: Any) -> dict[str, Batch]:
    """The final batch of 60 captured steps of ``integrator:npt-<kind>`` ("warp") and of 60 eager
    steps of its torch oracle ("torch")."""
    from integrators_testkit.oracles import oracle

    production = registry.resolve(f"integrator:npt-{kind}")
    finals = {}
    for which, cls in (("torch", oracle(production)), ("warp", production)):
        batch = _cells()
        if prepare is not None:
            prepare(batch)
        dynamics = cls(_model(), dt=5.0, **options)
        if cls is production:
            dynamics = dynamics.compile()
        with dynamics:
            dynamics.run(batch, n_steps=60)
        torch.cuda.synchronize()
        assert cls is not production or dynamics._engine.state.graph_captures >= 1
        finals[which] = batch
    assert not torch.allclose(finals["warp"].cell, _cells().cell)  # the cell moved
    return finals


def _assert_same(finals: dict[str, Batch], fields: tuple[str, ...]) -> None:
    for field in fields:
        torch.testing.assert_close(getattr(finals["warp"], field), getattr(finals["torch"], field), rtol=1e-9,
                                   atol=1e-10, msg=field)


@pytest.mark.parametrize("anisotropic", [False, True], ids=["isotropic", "anisotropic"])
def test_mtk_warp_kernels_take_the_torch_steps_on_the_gpu(anisotropic: bool) -> None:
    """MTK's Warp kernels, captured, end where the torch oracle's steps end (float64, 60 steps,
    the cell moving)."""
    finals = _captured_runs("mtk", temperature=50.0, tau_p=500.0, anisotropic=anisotropic, initial_temperature=50.0,
                            random_seed=1)
    _assert_same(finals, ("positions", "velocities", "cell", "npt_strain_rate"))


@pytest.mark.parametrize("kind", ["mtk", "crescale"])
def test_warp_step_never_synchronises_with_the_host(kind: str) -> None:
    batch = _cells()
    options = {"compressibility": 60.0} if kind == "crescale" else {}
    dynamics = registry.build(f"integrator:npt-{kind}", model=_model(), dt=5.0, temperature=50.0, tau_p=500.0,
                              initial_temperature=50.0, random_seed=1, **options)
    dynamics.step(batch)
    dynamics.step(batch)
    with no_host_sync():
        for _ in range(5):
            dynamics.step(batch)
    assert bool(torch.isfinite(batch.positions).all()) and bool(torch.isfinite(batch.cell).all())


@pytest.mark.parametrize("anisotropic", [False, True], ids=["isotropic", "anisotropic"])
def test_crescale_warp_kernels_take_the_torch_steps_when_the_noise_is_off(anisotropic: bool) -> None:
    """With the thermostat's coupling off (tau_t huge) and the barostat's noise negligible (T near
    0 K), C-rescale is deterministic: its Warp kernels, captured, end where the torch oracle's
    steps end (float64, 60 steps, the cell moving)."""
    from alchemi_integrators.thermo import initialize_velocities

    finals = _captured_runs("crescale", lambda batch: initialize_velocities(batch, 40.0, seed=2), temperature=1e-24,
                            tau_t=1e30, tau_p=100.0, compressibility=60.0, anisotropic=anisotropic)
    _assert_same(finals, ("positions", "velocities", "cell"))


def test_crescale_warp_replays_advance_the_draw_counter() -> None:
    """A captured C-rescale step advances its draw counter inside the graph (three draws a step),
    so every replay draws fresh numbers without a capture of its own."""
    batch = _cells()
    dynamics = registry.build("integrator:npt-crescale", model=_model(), dt=5.0, temperature=50.0, tau_p=500.0,
                              compressibility=60.0, initial_temperature=50.0, random_seed=1).compile()
    with dynamics:
        dynamics.run(batch, n_steps=20)
        torch.cuda.synchronize()
        captures = dynamics._engine.state.graph_captures
        assert captures >= 1
        before = int(dynamics.noise_counter(batch.device).item())
        dynamics.run(batch, n_steps=7)
        torch.cuda.synchronize()
        assert dynamics._engine.state.graph_captures == captures
    assert int(dynamics.noise_counter(batch.device).item()) == before + 3 * 7
