"""Nudged elastic bands (``integrator:neb``) against ASE's NEB, IDPP against ASE's, and many bands
in one run (one batch, and inflight with refill) against each band alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

ase = pytest.importorskip("ase")

from ase.build import bulk  # noqa: E402
from ase.calculators.emt import EMT  # noqa: E402
from ase.calculators.lj import LennardJones as AseLJ  # noqa: E402
from ase.mep import NEB as AseNEB  # noqa: E402
from ase.mep import idpp_interpolate  # noqa: E402
from ase.mep import interpolate as ase_interpolate  # noqa: E402
from ase.optimize import FIRE as AseFIRE  # noqa: E402

from alchemi_core.dynamics import DynamicsStage, Hook, HostMemory  # noqa: E402
from alchemi_core.errors import ConfigurationError, InvalidDataError  # noqa: E402
from alchemi_integrators.neb import NEB, neb  # noqa: E402
from alchemi_integrators.neb_bands import BandSampler, band_data, band_results  # noqa: E402
from alchemi_integrators.neb_paths import interpolate  # noqa: E402
from alchemi_potentials import AseCalculatorModel, LennardJones  # noqa: E402

AR_EPSILON, AR_SIGMA, AR_CUTOFF = 0.0104, 3.405, 8.0


def vacancy_hop(symbol: str, a: float, repeat: int | tuple[int, int, int], hop: int = 1) -> tuple[ase.Atoms, ase.Atoms]:
    """An fcc supercell without atom 0; the final state has atom ``hop`` moved into the vacancy."""
    initial = bulk(symbol, "fcc", a=a, cubic=True).repeat(repeat)
    vacancy = initial.positions[0].copy()
    del initial[0]
    final = initial.copy()
    final.positions[hop - 1] = vacancy
    return initial, final


def ase_band(initial: ase.Atoms, final: ase.Atoms, n_images: int, calc, *, k: float, climb: bool, fmax: float) -> list:
    images = [initial.copy() for _ in range(n_images - 1)] + [final.copy()]
    ase_interpolate(images)
    for image in images:
        image.calc = calc()
    band = AseNEB(images, k=k, climb=climb, method="improvedtangent")
    assert AseFIRE(band, logfile=None).run(fmax=fmax, steps=3000)
    return images


def assert_same_band(result, images) -> None:
    energies = np.array([im.get_potential_energy() for im in images])
    np.testing.assert_allclose(result.energies, energies, atol=1e-3)
    assert abs(result.barrier - (energies.max() - energies[0])) < 1e-3
    for mine, theirs in zip(result.images, images, strict=True):
        assert np.abs(mine.positions - theirs.positions).max() < 0.01


def lj_model() -> LennardJones:
    return LennardJones(AR_EPSILON, AR_SIGMA, AR_CUTOFF, shift_energy=True)


def ase_lj() -> AseLJ:
    return AseLJ(epsilon=AR_EPSILON, sigma=AR_SIGMA, rc=AR_CUTOFF)


#: Both NEBs converge to fmax/k along the path: an image on a slope of 1 eV/Å moves 1e-3 Å (and its
#: energy 1 meV) for fmax = 1e-4 at ASE's k = 0.1, so the comparison takes stiffer springs.
K, FMAX = 1.0, 3e-4


@pytest.mark.parametrize("climb", [True, False])
def test_emt_vacancy_hop_equals_ase(climb: bool) -> None:
    initial, final = vacancy_hop("Cu", 3.61, 2)
    band = interpolate(initial, final, 5)
    [result] = neb([band], AseCalculatorModel(EMT), k=K, climb=climb, fmax=FMAX, dt=5.0, dt_max=50.0, n_steps=3000)
    assert result.converged and result.fmax <= FMAX
    assert_same_band(result, ase_band(initial, final, 5, EMT, k=K, climb=climb, fmax=FMAX))
    assert 0.3 < result.barrier < 1.5  # a vacancy hop in Cu, not a flat line


def test_lj_vacancy_hop_equals_ase() -> None:
    initial, final = vacancy_hop("Ar", 5.26, 2)
    band = interpolate(initial, final, 7)
    [result] = neb([band], lj_model(), k=K, climb=True, fmax=FMAX, dt=10.0, dt_max=100.0, n_steps=5000)
    assert result.converged
    assert_same_band(result, ase_band(initial, final, 7, ase_lj, k=K, climb=True, fmax=FMAX))
    assert result.barrier > 0.01


@pytest.mark.parametrize("mic", [False, True])
def test_idpp_equals_ase(mic: bool) -> None:
    # A second-neighbour hop (a, 0, 0) -> (0, 0, 0): its straight line passes 1.8 Å from 4 atoms.
    # (3 cells along x: no difference along the path is half a cell, where the minimum image is a tie.)
    initial, _ = vacancy_hop("Cu", 3.61, (3, 2, 2))
    j = int(np.argmin(np.linalg.norm(initial.positions - (3.61, 0, 0), axis=1)))
    initial, final = vacancy_hop("Cu", 3.61, (3, 2, 2), hop=j + 1)
    if mic:  # the final state one cell away: only the minimum image makes the short path
        final.positions[j] += final.cell[1]
    images = [initial.copy() for _ in range(6)] + [final.copy()]
    ase_interpolate(images, mic=mic)
    idpp_interpolate(images, traj=None, log=None, mic=mic)
    mine = interpolate(initial, final, 7, method="idpp", mic=mic)
    linear = interpolate(initial, final, 7, mic=mic)
    moved = max(np.abs(a.positions - b.positions).max() for a, b in zip(images, linear, strict=True))
    assert moved > 0.05  # IDPP changed the straight line
    for a, b in zip(mine, images, strict=True):
        assert np.abs(a.positions - b.positions).max() < 1e-4


def lj_bands() -> list[list[ase.Atoms]]:
    """Bands of different systems: a hop in a 2x2x2 cell, the same with its atoms rattled 0.05 Å
    (the same noise in both end points), and a hop in a 3x2x2 cell (more atoms, more images)."""
    bands = []
    for repeat, rattle, n_images in (((2, 2, 2), 0.0, 5), ((2, 2, 2), 0.05, 5), ((3, 2, 2), 0.0, 7)):
        initial, final = vacancy_hop("Ar", 5.26, repeat)
        noise = np.random.default_rng(1).normal(scale=rattle, size=initial.positions.shape)
        initial.positions += noise
        final.positions += noise
        bands.append(interpolate(initial, final, n_images, method="idpp"))
    return bands


SETTINGS = {"climb": True, "fmax": 0.01, "dt": 10.0, "dt_max": 100.0, "n_steps": 3000}


def assert_results_equal(together, alone) -> None:
    for a, b in zip(together, alone, strict=True):
        assert a.converged and b.converged
        np.testing.assert_allclose(a.energies, b.energies, atol=1e-9)
        for x, y in zip(a.images, b.images, strict=True):
            np.testing.assert_allclose(x.positions, y.positions, atol=1e-9)


def test_bands_in_one_run_equal_each_alone() -> None:
    bands = lj_bands()
    model = lj_model()
    together = neb(bands, model, **SETTINGS)
    alone = [neb([band], model, **SETTINGS)[0] for band in bands]
    assert_results_equal(together, alone)
    assert len({round(r.barrier, 6) for r in together}) == 3  # three different paths


def inflight(bands, sink=None, hooks=()) -> NEB:
    """Six bands through slots for 12 images (at most two bands at once), refilled as they converge."""
    data = [band_data(band, b, 100 * b) for b, band in enumerate(bands)]
    sampler = BandSampler(data, max_batch_size=12, max_atoms=10_000)
    return NEB(lj_model(), sampler=sampler, sinks=[sink] if sink is not None else None, hooks=list(hooks),
               **SETTINGS)


def test_inflight_bands_refill_each_out_once() -> None:
    bands = lj_bands() * 2
    stage = inflight(bands)
    out = stage.run()
    assert stage.context.run.refills
    ids = sorted(out.system_id.view(-1).tolist())
    assert ids == [100 * b + i for b, band in enumerate(bands) for i in range(len(band))]  # every image once
    alone = [neb([band], lj_model(), **SETTINGS)[0] for band in bands[:3]]
    assert_results_equal(band_results(out, len(bands), SETTINGS["fmax"]), alone * 2)


class Interrupt(Hook):
    """Raises at a given step, as a killed job would."""

    stage = DynamicsStage.AFTER_STEP

    def __init__(self, at: int) -> None:
        super().__init__(frequency=1)
        self.at = at

    def __call__(self, batch, dynamics) -> None:
        if dynamics.step_count == self.at:
            raise KeyboardInterrupt("the job was stopped")


def test_killed_inflight_run_resumes_without_repeating_a_band(tmp_path) -> None:
    bands = lj_bands() * 2
    reference = HostMemory(capacity=None)
    inflight(bands, reference).run()
    expected = reference.read()
    sink = HostMemory(capacity=None)
    with pytest.raises(KeyboardInterrupt):
        # (the whole run takes about 90 steps: killed at 50, with bands out and bands running)
        inflight(bands, sink, hooks=[Interrupt(at=50)]).run(checkpoint=tmp_path / "neb.ckpt", checkpoint_every=10)
    assert 0 < len(sink.read().system_id) < len(expected.system_id)  # killed half-way: some bands out
    fresh = HostMemory(capacity=None)
    inflight(bands, fresh).run(resume_from=tmp_path / "neb.ckpt")
    got = fresh.read()
    assert sorted(got.system_id.tolist()) == sorted(expected.system_id.tolist())  # each image once
    a = got.index_select(torch.argsort(got.system_id))
    b = expected.index_select(torch.argsort(expected.system_id))
    # (Not bit for bit: the resumed LJ model builds its neighbour list afresh, in another order.)
    torch.testing.assert_close(a.positions, b.positions, rtol=0, atol=1e-9)
    torch.testing.assert_close(a.energy, b.energy, rtol=0, atol=1e-9)


def test_end_points_relax_with_the_band() -> None:
    """``relax_endpoints``: rattled end points relax (FIRE on their true forces) while the band
    relaxes; they end at the minima FIRE finds for each alone (to 0.1 meV), and their forces count
    in the band's fmax."""
    from alchemi_core.data import Batch
    from alchemi_core.dynamics import ConvergenceHook
    from alchemi_integrators import FIRE

    band = lj_bands()[1]  # rattled end points: not minima
    fmax = 0.002
    [result] = neb([band], lj_model(), relax_endpoints=True, **{**SETTINGS, "fmax": fmax})
    assert result.converged
    ends = Batch.from_atoms([band[0], band[-1]], dtype=torch.float64)
    FIRE(lj_model(), n_steps=5000, dt=10.0, dt_max=100.0,
         convergence_hook=ConvergenceHook.from_fmax(1e-4, frequency=1)).run(ends)
    np.testing.assert_allclose(result.energies[[0, -1]], ends.energy.view(-1).numpy(), atol=1e-4)
    for image in (result.images[0], result.images[-1]):
        assert np.linalg.norm(image.get_forces(), axis=1).max() <= fmax
    fixed = neb([band], lj_model(), **{**SETTINGS, "fmax": fmax})[0]
    assert abs(fixed.energies[0] - result.energies[0]) > 1e-3  # the fixed end points did not relax


def test_band_sampler_hands_out_whole_bands() -> None:
    data = [band_data(band, b, 100 * b) for b, band in enumerate(lj_bands())]
    sampler = BandSampler(data, max_batch_size=12, max_atoms=10_000)
    first = sampler.build_initial_batch()  # the largest band first, then the largest that fits
    assert first.neb_band.view(-1).tolist() == [2] * 7 + [0] * 5
    assert first.neb_image.view(-1).tolist() == [*range(7), *range(5)]
    assert sampler.request_batch(4, 10_000, None) is None  # no band fits 4 slots
    rest = sampler.request_batch(5, 10_000, None)
    assert rest is not None and rest.neb_band.view(-1).tolist() == [1] * 5 and sampler.exhausted
    with pytest.raises(ConfigurationError, match="max_batch_size"):
        BandSampler(data, max_batch_size=6, max_atoms=10_000)


def test_band_sampler_groups_a_dataset_of_images() -> None:
    """Images in any order, each with ``atoms.info["neb_band"]``/``["neb_image"]``, become whole bands."""
    from alchemi_core.data import AtomicData
    from alchemi_core.data.datapipes import ListDataset

    frames = []
    for b, band in enumerate(lj_bands()[:2]):
        for i, image in enumerate(band):
            image = image.copy()
            image.info.update(neb_band=10 + b, neb_image=i)
            frames.append(AtomicData.from_atoms(image))
    order = np.random.default_rng(0).permutation(len(frames))
    sampler = BandSampler.from_images(ListDataset([frames[i] for i in order]), max_batch_size=10, max_atoms=10_000)
    batch = sampler.build_initial_batch()
    assert batch.neb_band.view(-1).tolist() == [10] * 5 + [11] * 5
    assert batch.neb_image.view(-1).tolist() == [*range(5), *range(5)]
    assert sorted(batch.system_id.view(-1).tolist()) == list(range(10))  # their places in the dataset
    del frames[3]  # band 10 loses image 3
    with pytest.raises(InvalidDataError, match="images 0..N-1"):
        BandSampler.from_images(ListDataset(frames), max_batch_size=10, max_atoms=10_000)
    with pytest.raises(InvalidDataError, match="neb_band"):
        BandSampler.from_images(ListDataset([AtomicData.from_atoms(lj_bands()[0][0])]), max_atoms=10_000)


def test_wrong_input_is_refused() -> None:
    initial, final = vacancy_hop("Ar", 5.26, 2)
    other = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2)
    del other[0]
    with pytest.raises(InvalidDataError, match="same atoms"):
        band_data([initial, initial, other], 0)
    with pytest.raises(InvalidDataError, match="at least 3"):
        band_data([initial, final], 0)
    with pytest.raises(ConfigurationError, match="cell filter"):
        NEB(lj_model(), cell_filter="frechet")
    from alchemi_core.data import Batch

    with pytest.raises(ConfigurationError, match="neb_band"):
        NEB(lj_model(), n_steps=1).run(Batch.from_atoms([initial, final], dtype=torch.float64))
    images = band_data([initial, initial, final], 0)
    with pytest.raises(InvalidDataError, match="images 0..N-1"):  # a band without its last image
        NEB(lj_model(), n_steps=1).run(Batch.from_data_list(images[:2]))
    swapped = images[1].clone()
    swapped.positions = swapped.positions.flip(0)
    swapped.atomic_numbers = torch.arange(len(initial))  # other atoms than image 0
    with pytest.raises(InvalidDataError, match="other atoms"):
        NEB(lj_model(), n_steps=1).run(Batch.from_data_list([images[0], swapped, images[2]]))


class Record(Hook):
    """Copies a field at a hook point, every step."""

    def __init__(self, stage: DynamicsStage, *names: str) -> None:
        super().__init__(frequency=1)
        self.stage = stage
        self.names = names
        self.seen: list[dict[str, torch.Tensor]] = []

    def __call__(self, batch, dynamics) -> None:
        self.seen.append({n: getattr(batch, n).detach().clone() for n in self.names})


@pytest.mark.parametrize(("climb_fmax", "climbs"), [(0.0, True), (1e-6, False)])
def test_neb_forces_equal_the_torch_oracle(climb_fmax: float, climbs: bool) -> None:
    """The Warp kernels' NEB forces, of two bands whose images are shuffled in the batch (one band
    crossing the cell's face), against the torch version that IDPP uses (ASE's improved tangent)."""
    from alchemi_core.data import Batch
    from alchemi_integrators.neb_paths import neb_forces

    initial, final = vacancy_hop("Ar", 5.26, 2)
    final.positions[0] += final.cell[2]  # the hop seen through the periodic boundary
    crossing = interpolate(initial, final, 5, mic=True)
    rng = np.random.default_rng(3)
    for image in crossing[1:-1]:
        image.positions += rng.normal(scale=0.05, size=image.positions.shape)
    bands = [crossing, lj_bands()[2]]
    data = band_data(bands[0], 0, 0) + band_data(bands[1], 1, 100)
    batch = Batch.from_data_list(data).index_select(torch.from_numpy(rng.permutation(len(data))))
    before = Record(DynamicsStage.BEFORE_PRE_UPDATE, "positions", "forces", "energy")
    after = Record(DynamicsStage.AFTER_PRE_UPDATE, "forces")
    k = 0.7
    NEB(lj_model(), k=k, climb=True, climb_fmax=climb_fmax, dt=10.0, n_steps=3, hooks=[before, after]).run(batch)
    band, image = batch.neb_band.view(-1), batch.neb_image.view(-1)
    cell = torch.as_tensor(np.asarray(initial.cell), dtype=torch.float64)
    pbc = torch.ones(3, dtype=torch.bool)
    checked = 0
    for old, new in zip(before.seen, after.seen, strict=True):
        for b, atoms in ((0, len(initial)), (1, len(bands[1][0]))):
            rows = sorted(torch.nonzero(band == b).view(-1).tolist(), key=lambda r: int(image[r]))
            atom_rows = [torch.arange(batch.batch_ptr[r], batch.batch_ptr[r] + atoms) for r in rows]
            x = torch.stack([old["positions"][a] for a in atom_rows])
            f = torch.stack([old["forces"][a] for a in atom_rows])
            got = torch.stack([new["forces"][a] for a in atom_rows])
            energies = old["energy"].view(-1)[rows]
            expected = neb_forces(x, energies, f[1:-1], cell, pbc, k, climb=climbs)
            torch.testing.assert_close(got[1:-1], expected, rtol=0, atol=1e-10)
            assert not got[0].any() and not got[-1].any()  # end points feel nothing
            checked += 1
    assert checked == 6


# ---------------------------------------------------------------------------------------- GPU
GPU = pytest.mark.gpu
GPU_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _gpu_batch():
    from alchemi_core.data import Batch

    bands = lj_bands()
    data = [d for b, band in enumerate(bands) for d in band_data(band, b, 100 * b)]
    return Batch.from_data_list(data).to("cuda")


@GPU
@GPU_ONLY
def test_a_neb_step_never_synchronises_with_the_host() -> None:
    from alchemi_core.testing.gpu import no_host_sync

    batch = _gpu_batch()
    stage = NEB(lj_model(), climb=True, climb_fmax=0.1, dt=10.0, n_steps=100)
    stage.step(batch)  # the first step prepares the run (allowed to read back)
    stage.step(batch)
    with no_host_sync():
        for _ in range(5):
            stage.step(batch)
    assert bool(torch.isfinite(batch.positions).all())


@GPU
@GPU_ONLY
def test_a_captured_neb_run_equals_the_eager_one() -> None:
    eager, captured = _gpu_batch(), _gpu_batch()
    NEB(lj_model(), **SETTINGS).run(eager)
    stage = NEB(lj_model(), **SETTINGS).compile()
    stage.run(captured)
    assert stage._engine.state.graph_captures >= 1
    for a, b in zip(band_results(eager, 3, SETTINGS["fmax"]), band_results(captured, 3, SETTINGS["fmax"]),
                    strict=True):
        assert a.converged and b.converged
        np.testing.assert_allclose(a.energies, b.energies, atol=1e-8)


@GPU
@GPU_ONLY
def test_inflight_bands_on_the_gpu_equal_the_cpu() -> None:
    bands = lj_bands() * 2
    gpu = neb(bands, lj_model(), max_images=12, device="cuda", **SETTINGS)
    cpu = neb(bands[:3], lj_model(), **SETTINGS)
    for a, b in zip(gpu, cpu * 2, strict=True):
        assert a.converged
        assert abs(a.barrier - b.barrier) < 1e-6


def test_a_workflow_stage_runs_bands_from_a_file(tmp_path) -> None:
    """``integrator:neb`` as a workflow's stage: images from an extxyz file with
    ``atoms.info["neb_band"]``/``["neb_image"]``, two bands at a time, results in a store whose
    bands equal :func:`neb`'s (checked at every step, as ``neb`` does)."""
    pytest.importorskip("alchemi_zarr")
    import ase.io

    from alchemi_core.workflow import parse_workflow, run_workflow
    from alchemi_core.workflow.results import export_structures

    bands = lj_bands()
    frames = []
    for b, band in enumerate(bands):
        for i, image in enumerate(band):
            image = image.copy()
            image.info.update(neb_band=b, neb_image=i)
            frames.append(image)
    ase.io.write(tmp_path / "bands.extxyz", frames)
    wf = parse_workflow(f"""
[model]
component = "model:lennard-jones"
epsilon = {AR_EPSILON}
sigma = {AR_SIGMA}
cutoff = {AR_CUTOFF}
shift_energy = true
[input]
path = "{tmp_path}/bands.extxyz"
dtype = "float64"
[[stage]]
component = "integrator:neb"
climb = true
k = 0.1
dt = 10.0
dt_max = 100.0
n_steps = 3000
converge = {{ fmax = 0.01, frequency = 1 }}
[sampler]
max_batch_size = 12
refill_frequency = 1
[output]
path = "{tmp_path}/results.zarr"
""")
    summary = run_workflow(wf, device="cpu", progress=False)
    assert summary.structures_out == len(frames)
    export_structures(tmp_path / "results.zarr", tmp_path / "out.extxyz")
    out = ase.io.read(tmp_path / "out.extxyz", ":")
    alone = neb(bands, lj_model(), **SETTINGS)
    for b, result in enumerate(alone):
        images = sorted((a for a in out if a.info["neb_band"] == b), key=lambda a: a.info["neb_image"])
        assert len(images) == len(bands[b])
        energies = np.array([a.get_potential_energy() for a in images])
        np.testing.assert_allclose(energies, result.energies, atol=1e-8)
    pytest.importorskip("matplotlib")
    from alchemi_core.workflow.results import plot_results

    assert tmp_path / "plots" / "bands.png" in plot_results(tmp_path / "results.zarr", tmp_path / "plots", ["bands"])
