"""Trajectory analysis against independent references: RDFs against direct numpy histograms of the
same frames, the MSD of an ideal gas against free flight, the MSD of Langevin free particles
against the Ornstein-Uhlenbeck result, and the VACF's Green-Kubo integral and spectrum against
the MSD's diffusion coefficient and the Lorentzian they must follow."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from ase import Atoms, units
from ase.build import bulk

from alchemi_core import registry
from alchemi_core.data import Batch
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_core.models import BaseModel, ModelCard
from alchemi_properties.analysis import Trajectory, msd, plot_store, rdf, unwrap, vacf

KB_T_300 = units.kB * 300.0
MASS_AR = 39.948


class FreeParticles(BaseModel):
    """No forces at all: an ideal gas."""

    card = ModelCard(name="free-particles", cutoff=None, periodic=True)

    def forward(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        pos = batch.positions
        return {"energy": torch.zeros(batch.num_graphs, 1, dtype=pos.dtype, device=pos.device),
                "forces": torch.zeros_like(pos)}


def store_run(integrator: str, atoms: Atoms, n_steps: int, every: int, store: str, wrap: bool = False,
              **kwargs: object) -> None:
    """Run ``atoms`` and keep a frame every ``every`` steps in ``store`` (``SnapshotHook``)."""
    from alchemi_zarr import ZarrData

    sink = ZarrData(store)
    hooks = [registry.build("hook:wrap-periodic", frequency=1)] if wrap else []
    hooks.append(registry.build("hook:snapshot", sink=sink, frequency=every))
    md = registry.build(integrator, n_steps=n_steps, hooks=hooks, random_seed=3, **kwargs)
    md.run(Batch.from_atoms([atoms], dtype=torch.float64))
    sink.close()


def numpy_rdf(frames: list[Atoms], r_max: float, bins: int, shifts: int = 0) -> dict[object, np.ndarray]:
    """g(r) by brute force: every ordered pair (i, j) over every image shift in [-shifts, shifts]³
    after rounding fractional displacements (i with itself only at a nonzero shift), histogrammed
    by np.histogram and normalised by N_a N_b / V and the shell volume, averaged over frames."""
    edges = np.linspace(0.0, r_max, bins + 1)
    shell = 4.0 / 3.0 * np.pi * (edges[1:] ** 3 - edges[:-1] ** 3)
    out: dict[object, np.ndarray] = {}
    for atoms in frames:
        x, cell, z = atoms.positions, atoms.cell.array, atoms.numbers
        d = x[None, :, :] - x[:, None, :]
        s = d @ np.linalg.inv(cell)
        d = (s - np.round(s)) @ cell
        dists = []
        for k in itertools.product(range(-shifts, shifts + 1), repeat=3):
            r = np.linalg.norm(d + np.asarray(k) @ cell, axis=-1)
            if not any(k):
                r[np.diag_indices(len(x))] = np.inf
            dists.append(r)
        r_all = np.stack(dists, axis=-1)  # [N, N, K]
        keys = [(a, b) for a in np.unique(z) for b in np.unique(z) if a <= b] + ["total"]
        for key in keys:
            if key == "total":
                sel, norm = r_all, len(x) ** 2
            else:
                a, b = key
                sel = np.concatenate([r_all[z == a][:, z == b].ravel(), r_all[z == b][:, z == a].ravel()])
                norm = 2 * (z == a).sum() * (z == b).sum()
            counts = np.histogram(sel.ravel(), bins=edges)[0]
            g = counts * atoms.get_volume() / (norm * shell)
            out[key] = out.get(key, 0) + g / len(frames)
    return out


@pytest.fixture(scope="module")
def lj_liquid(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store of 20 frames of a hot Ar/Kr Lennard-Jones mixture (256 atoms) from a Langevin run that
    starts from an fcc lattice and melts within the first half."""
    atoms = bulk("Ar", "fcc", a=5.8, cubic=True).repeat(4)
    atoms.numbers[np.random.default_rng(0).permutation(len(atoms))[:96]] = 36
    lj = registry.build("model:lennard-jones", epsilon={18: 0.0104, 36: 0.014}, sigma={18: 3.405, 36: 3.65},
                        cutoff=8.5)
    store = str(tmp_path_factory.mktemp("lj") / "liquid.zarr")
    store_run("integrator:langevin", atoms, 600, 30, store, model=lj, dt=5.0, temperature=250.0,
              initial_temperature=250.0, friction=0.002)
    return store


def test_rdf_of_an_lj_liquid_equals_a_numpy_histogram(lj_liquid: str) -> None:
    from alchemi_zarr import AtomicDataZarrReader

    traj = Trajectory.from_store(lj_liquid, dt=5.0)
    assert traj.num_frames == 20 and traj.times[1] - traj.times[0] == 150.0
    result = rdf(traj, r_max=11.0, bins=110, frames=slice(10, None))  # the liquid half
    frames = [rec.to_atoms() for rec in AtomicDataZarrReader(lj_liquid)][10:]
    assert result.frames == 10
    ref = numpy_rdf(frames, 11.0, 110)
    assert sorted(result.g) == [(18, 18), (18, 36), (36, 36)]
    for key, g in result.g.items():
        np.testing.assert_allclose(g.numpy(), ref[key], rtol=1e-12, atol=1e-12, err_msg=str(key))
    np.testing.assert_allclose(result.total.numpy(), ref["total"], rtol=1e-12, atol=1e-12)
    # A liquid: no pairs inside the core, a first shell near 2^(1/6) sigma, g -> 1 far out.
    r = result.r.numpy()
    assert result.total[r < 2.7].sum() == 0
    assert 3.5 < r[int(result.total.argmax())] < 4.4
    assert abs(float(result.total[r > 9.0].mean()) - 1.0) < 0.1
    # Per element: the MSDs of Ar and Kr weigh into the total.
    displacement = msd(traj)
    parts = displacement.by_element()
    torch.testing.assert_close((160 * parts[18] + 96 * parts[36]) / 256, displacement.mean)
    torch.testing.assert_close(displacement.of(36), parts[36])


def test_plots_of_a_store_holding_md(lj_liquid: str, tmp_path) -> None:
    """rdf.png and msd.png are real pictures; a store of single frames has nothing to draw."""
    import matplotlib.image

    from alchemi_zarr import ZarrData

    paths = plot_store(lj_liquid, tmp_path / "plots", dt=5.0)
    assert [p.name for p in paths] == ["rdf.png", "msd.png"]
    for p in paths:
        image = matplotlib.image.imread(p)
        assert image.shape[:2] == (400, 640) and image[..., :3].std() > 0.05  # lines and text, not blank
    ZarrData(tmp_path / "relaxed.zarr").write(Batch.from_atoms([bulk("Cu")] * 2))
    assert plot_store(tmp_path / "relaxed.zarr", tmp_path / "none") == []
    with pytest.raises(ConfigurationError, match="unknown analysis plot 'vacf'"):
        plot_store(lj_liquid, tmp_path, kinds=["vacf"])


def test_rdf_in_a_skewed_cell_beyond_half_its_width_counts_every_image() -> None:
    """A triclinic cell whose widths are below r_max: every image counts, an atom's own included;
    two frames of different volume, in chunks of a few hundred distances."""
    rng = np.random.default_rng(4)
    cell = np.array([[6.0, 0.0, 0.0], [3.0, 5.0, 0.0], [1.5, 2.0, 5.5]])
    frames = []
    for scale in (1.0, 1.05):
        atoms = Atoms(numbers=[8] * 7 + [14] * 5, cell=cell * scale, pbc=True)
        atoms.set_scaled_positions(rng.uniform(-0.3, 1.3, (12, 3)))  # some outside the cell
        frames.append(atoms)
    traj = Trajectory.from_frames(frames)
    result = rdf(traj, r_max=8.0, bins=40, pair_budget=300)
    ref = numpy_rdf(frames, 8.0, 40, shifts=3)
    for key, g in result.g.items():
        np.testing.assert_allclose(g.numpy(), ref[key], rtol=1e-12, atol=1e-12, err_msg=str(key))
    np.testing.assert_allclose(result.total.numpy(), ref["total"], rtol=1e-12, atol=1e-12)
    assert result.total[-10:].mean() == pytest.approx(1.0, abs=0.3)


def test_msd_of_an_ideal_gas_is_free_flight(tmp_path) -> None:
    """No forces: every atom flies straight, MSD_i(t) = |v_i|² t² exactly, through positions
    wrapped back into a small box every step; over atoms, <|v|²> = 3 kT/m within its error."""
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat(4)  # 256 atoms, a 21 Å box
    store = str(tmp_path / "gas.zarr")
    store_run("integrator:velocity-verlet", atoms, 600, 10, store, wrap=True, model=FreeParticles(), dt=10.0,
              initial_temperature=300.0)
    traj = Trajectory.from_store(store, dt=10.0)
    box = atoms.cell.lengths()[0]
    assert float(traj.positions.min()) >= 0.0 and float(traj.positions.max()) <= box  # stored wrapped
    result = msd(traj)
    v2 = (traj.velocities[0] ** 2).sum(-1)
    assert float(result.mean[-1]) > box**2  # atoms crossed the box several times
    expected = v2[:, None] * result.lag_times[None, :] ** 2
    torch.testing.assert_close(result.per_atom, expected, rtol=1e-9, atol=1e-9)
    kt_over_m = KB_T_300 / MASS_AR * units.fs**2  # Å²/fs²
    se = float(v2.std()) / math.sqrt(len(v2))
    assert abs(float(v2.mean()) - 3 * kt_over_m) < 4 * se
    # Unwrapping a trajectory that was never wrapped changes nothing.
    straight = Trajectory.from_arrays(unwrap(traj), cell=traj.cell, dt=100.0)
    torch.testing.assert_close(unwrap(straight), straight.positions)


def test_msd_and_vacf_equal_direct_sums_over_time_origins() -> None:
    """The FFT forms against the O(F²) definitions in numpy, on random data in a triclinic cell
    whose positions never wrap."""
    rng = np.random.default_rng(5)
    x = 20 + np.cumsum(rng.normal(0.0, 0.2, (40, 9, 3)), axis=0)
    v = rng.normal(0.0, 0.01, (40, 9, 3))
    traj = Trajectory.from_arrays(x, cell=[[30.0, 0, 0], [10, 30, 0], [5, 5, 30]], velocities=v, dt=2.5)
    lags = np.arange(31)
    msd_ref = np.stack([((x[m:] - x[: 40 - m]) ** 2).sum(-1).mean(0) for m in lags], axis=1)
    vacf_ref = np.stack([(v[m:] * v[: 40 - m]).sum(-1).mean(0) for m in lags], axis=1)
    result = msd(traj, max_lag=30)
    np.testing.assert_allclose(result.per_atom.numpy(), msd_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(result.lag_times.numpy(), lags * 2.5)
    np.testing.assert_allclose(vacf(traj, max_lag=30).per_atom.numpy(), vacf_ref, rtol=1e-10, atol=1e-14)


@pytest.fixture(scope="module")
def free_langevin(tmp_path_factory: pytest.TempPathFactory) -> Trajectory:
    """1,000 argon atoms without forces under Langevin (gamma = 0.01/fs), a frame every 8 fs for
    4,000 fs (40 velocity relaxation times)."""
    atoms = bulk("Ar", "fcc", a=5.26, cubic=True).repeat((5, 5, 10))
    store = str(tmp_path_factory.mktemp("langevin") / "free.zarr")
    store_run("integrator:langevin", atoms, 1000, 2, store, model=FreeParticles(), dt=4.0, temperature=300.0,
              initial_temperature=300.0, friction=0.01, fix_com=False)
    return Trajectory.from_store(store, dt=4.0)


GAMMA = 0.01  # 1/fs
D_EXACT = KB_T_300 / MASS_AR * units.fs**2 / GAMMA  # kT / (m gamma), Å²/fs


def test_msd_of_langevin_free_particles_is_the_ornstein_uhlenbeck_result(free_langevin: Trajectory) -> None:
    """MSD(t) = 6 D (t - tau (1 - exp(-t/tau))), tau = 1/gamma, D = kT/(m gamma), within four
    standard errors (atoms are independent: the error is the spread of per-atom MSDs)."""
    result = msd(free_langevin)
    t = result.lag_times
    tau = 1.0 / GAMMA
    exact = 6 * D_EXACT * (t - tau * (1 - torch.exp(-t / tau)))
    se = result.per_atom.std(0) / math.sqrt(free_langevin.num_atoms)
    for lag in (16, 48, 96, 200, 496, 1000, 2000):  # fs: frames are 8 fs apart
        k = lag // 8
        assert abs(float(result.mean[k] - exact[k])) < 4 * float(se[k]), (float(t[k]), float(result.mean[k]),
                                                                        float(exact[k]))
    d = result.diffusion_coefficient(start=500.0, stop=2000.0)  # t >> tau: slope 6 D
    assert d == pytest.approx(D_EXACT, rel=0.05)


def test_vacf_integral_and_spectrum_agree_with_the_msd(free_langevin: Trajectory) -> None:
    """Green-Kubo D = (1/3) ∫ VACF equals the MSD's D within 5 %; the VACF is (3 kT/m) exp(-gamma t)
    and its spectrum the Lorentzian S(nu) = S(0) / (1 + (2 pi nu / gamma)²), S(0) = 6 D."""
    from_msd = msd(free_langevin).diffusion_coefficient(start=500.0, stop=2000.0)
    result = vacf(free_langevin, max_lag=250)  # 2,000 fs = 20 relaxation times
    from_vacf = result.diffusion_coefficient(stop=2000.0)
    assert from_vacf == pytest.approx(from_msd, rel=0.05)
    assert from_vacf == pytest.approx(D_EXACT, rel=0.05)
    c0 = 3 * KB_T_300 / MASS_AR * units.fs**2
    assert float(result.mean[0]) == pytest.approx(c0, rel=0.03)
    assert float(result.mean[int(100 / 8)]) == pytest.approx(c0 * math.exp(-GAMMA * 96), rel=0.05)
    freq, spectrum = result.power_spectrum(window=None)
    assert float(spectrum[0]) == pytest.approx(6 * from_vacf, rel=0.01)
    half = GAMMA / (2 * math.pi) * 1000.0  # THz
    k = int(torch.argmin((freq - half).abs()))
    lorentz = 6 * D_EXACT / (1 + (2 * math.pi * float(freq[k]) / 1000.0 / GAMMA) ** 2)
    assert float(spectrum[k]) == pytest.approx(lorentz, rel=0.1)
    assert float(result.power_spectrum()[1][0]) < float(spectrum[0])  # the Hann window damps the tail


def test_from_store_takes_the_last_stage_without_quarantined_or_repeated_records() -> None:
    """Records of one structure at stage steps 10, 20, 30, then (a later stage) 5, 8 (quarantined),
    10 and 10 again (its final record): the frames are those at 5 and 10, the first of the two."""
    from alchemi_zarr import ZarrData

    sink = ZarrData("memory://analysis-stages")
    for k, (step, status) in enumerate([(10, 0), (20, 0), (30, 0), (5, 0), (8, -1), (10, 0), (10, 1)]):
        batch = Batch.from_atoms([bulk("Cu", cubic=True)], dtype=torch.float64)
        batch.positions += k  # tells the records apart
        batch.set_field("stage_steps", torch.tensor([step]), "system")
        batch.set_field("status", torch.tensor([status]), "system")
        batch.set_field("system_id", torch.tensor([4]), "system")
        sink.write(batch)
    traj = Trajectory.from_store("memory://analysis-stages", dt=2.0)
    assert traj.times.tolist() == [10.0, 20.0]
    assert traj.positions[:, 0, 0].tolist() == [3.0, 5.0]


def test_bad_input_is_refused_clearly(tmp_path) -> None:
    from alchemi_zarr import ZarrData

    frames = np.zeros((3, 4, 3))
    with pytest.raises(InvalidDataError, match="no velocities|needs velocities"):
        vacf(Trajectory.from_arrays(frames, cell=np.eye(3) * 5))
    with pytest.raises(InvalidDataError, match="evenly spaced"):
        msd(Trajectory.from_arrays(frames, cell=np.eye(3) * 5, times=[0.0, 1.0, 3.0]))
    with pytest.raises(InvalidDataError, match="increase"):
        Trajectory.from_arrays(frames, times=[0.0, 1.0, 1.0], pbc=False)
    with pytest.raises(InvalidDataError, match="periodic"):
        rdf(Trajectory.from_arrays(frames), r_max=2.0)
    with pytest.raises(InvalidDataError, match="nonzero volume"):
        rdf(Trajectory.from_arrays(frames, cell=np.zeros((3, 3)), pbc=True), r_max=2.0)
    with pytest.raises(ConfigurationError, match="r_max"):
        rdf(Trajectory.from_arrays(frames, cell=np.eye(3) * 5), r_max=0.0)
    with pytest.raises(InvalidDataError, match="shape"):
        Trajectory.from_arrays(frames, cell=np.eye(3), atomic_numbers=[1, 2])
    with pytest.raises(InvalidDataError, match="non-finite"):
        Trajectory.from_arrays(np.full((2, 1, 3), np.nan), pbc=False)
    with pytest.raises(ConfigurationError, match="no atoms of element 99"):
        msd(Trajectory.from_arrays(frames, cell=np.eye(3) * 5)).diffusion_coefficient(element=99)
    with pytest.raises(ConfigurationError, match="fit window"):
        msd(Trajectory.from_arrays(frames, cell=np.eye(3) * 5)).diffusion_coefficient(start=5.0, stop=6.0)
    two = str(tmp_path / "two.zarr")
    ZarrData(two).write(Batch.from_atoms([bulk("Cu")] * 2))
    with pytest.raises(InvalidDataError, match="no .*records of system_id 7"):
        Trajectory.from_store(two, system_id=7, dt=1.0)
    with pytest.raises(InvalidDataError, match="holds 2 structures; pick one with system_id"):
        Trajectory.from_store(two, dt=1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_analysis_on_the_gpu_equals_the_cpu(free_langevin: Trajectory) -> None:
    gpu = free_langevin.to("cuda")
    torch.testing.assert_close(msd(gpu).per_atom.cpu(), msd(free_langevin).per_atom)
    torch.testing.assert_close(vacf(gpu).per_atom.cpu(), vacf(free_langevin).per_atom)
    some = slice(0, 20)
    torch.testing.assert_close(rdf(gpu, 8.0, frames=some).total.cpu(), rdf(free_langevin, 8.0, frames=some).total)
