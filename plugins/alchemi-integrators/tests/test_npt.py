"""NPT (MTK and C-rescale) on small LJ argon cells: conservation, targets per system, fused stages."""

from __future__ import annotations

import pytest
import torch
from integrators_testkit.lj_reference import ReferenceLJ, argon
from integrators_testkit.oracles import implementation
from integrators_testkit.resume import resumed_run

from alchemi_core import registry, units
from alchemi_core.data import Batch
from alchemi_core.dynamics import ConvergenceHook, DynamicsStage, FusedStage, Hook
from alchemi_integrators import FIRE2, NPH, NPTMTK, NPTCRescale
from alchemi_integrators.cell_filter import CELL_FILTER_FMAX
from alchemi_integrators.thermo import initialize_velocities, kinetic_energy


def _argon_batch(n: int, rattle: float = 0.05, strain: float = 1.0) -> Batch:
    data = []
    for s in range(n):
        d = argon(2, rattle=rattle, seed=s)
        d.cell, d.positions = d.cell * strain, d.positions * strain
        data.append(d)
    return Batch.from_data_list(data)


def test_registered() -> None:
    assert registry.resolve("integrator:npt-mtk") is NPTMTK
    assert registry.resolve("integrator:npt-crescale") is NPTCRescale


@pytest.mark.parametrize("anisotropic", [False, True], ids=["isotropic", "anisotropic"])
def test_mtk_conserves_its_energy(anisotropic: bool) -> None:
    """The MTK extended energy of 32-atom argon at 50 K, dt 5 fs, stays within 2e-5 eV per atom
    over 2 ps while the volume moves (a wrong coupling term moves it by far more; the drift per ns
    is measured on 256-atom cells in tests/integration/test_npt_statistics.py)."""
    batch = _argon_batch(2)
    initialize_velocities(batch, 50.0, seed=1)
    npt = NPTMTK(ReferenceLJ(), dt=5.0, temperature=50.0, pressure=0.0, tau_t=100.0, tau_p=500.0,
                 anisotropic=anisotropic)
    npt.run(batch, n_steps=1)
    v0 = torch.linalg.det(batch.cell).clone()
    energies = [npt.conserved_energy(batch).clone()]
    for _ in range(40):
        npt.run(batch, n_steps=10)
        energies.append(npt.conserved_energy(batch).clone())
    e = torch.stack(energies) / 32
    assert (e - e[0]).abs().max().item() < 2e-5
    assert (torch.linalg.det(batch.cell) / v0 - 1).abs().max().item() > 1e-3  # the volume moved


_MTK_STATE = ("positions", "velocities", "cell", "npt_strain_rate", "npt_thermostat_positions",
              "npt_thermostat_velocities", "npt_barostat_chain_positions", "npt_barostat_chain_velocities")


#: C-rescale with its noise off: the thermostat's coupling off (tau_t huge) and the barostat's
#: noise negligible (T near 0 K), so production and oracle take the same pressure-driven steps.
_QUIET_CRESCALE = {"dt": 5.0, "temperature": 1e-24, "tau_t": 1e30, "tau_p": 100.0, "compressibility": 60.0}


def _mtk_runs(anisotropic: bool, steps: int, prepare=None, **kwargs) -> dict[str, tuple[Batch, torch.Tensor]]:
    """Four systems at per-system temperatures, ``steps`` MTK steps of production and of the oracle."""
    runs = {}
    for backend in ("torch", "warp"):
        batch = _argon_batch(4)
        if prepare is not None:
            batch = prepare(batch)
        dtype = batch.positions.dtype
        batch.set_field("target_t", torch.tensor([30.0, 50.0, 70.0, 90.0], dtype=dtype), "system")
        initialize_velocities(batch, 50.0, seed=3)
        npt = implementation(NPTMTK, backend)(ReferenceLJ(), dt=5.0, temperature="target_t", pressure=0.0, tau_t=50.0, tau_p=200.0,
                     anisotropic=anisotropic, **kwargs)
        npt.run(batch, n_steps=steps)
        runs[backend] = (batch, npt.conserved_energy(batch))
    return runs


@pytest.mark.parametrize("anisotropic", [False, True], ids=["isotropic", "anisotropic"])
def test_mtk_warp_backend_takes_the_torch_steps(anisotropic: bool) -> None:
    """The Warp kernels (mtk_kernels) take MTK's torch steps: 60 steps of four float64 systems
    with per-system temperatures and a moving cell agree in every state field to rounding."""
    runs = _mtk_runs(anisotropic, 60, chain_length=4, yoshida_order=5)
    (a, ea), (b, eb) = runs["warp"], runs["torch"]
    assert (torch.linalg.det(a.cell) / torch.linalg.det(_argon_batch(4).cell) - 1).abs().min().item() > 1e-4
    strain = a.npt_strain_rate
    if anisotropic:
        assert (strain - strain.transpose(1, 2)).abs().max().item() < 1e-15  # symmetric
        assert (strain - torch.diag_embed(strain.diagonal(dim1=1, dim2=2))).abs().max().item() > 0  # not diagonal
    else:
        eye = torch.eye(3, dtype=strain.dtype)
        torch.testing.assert_close(strain, strain[:, :1, :1] * eye, rtol=0, atol=0)  # a multiple of I
    for field in _MTK_STATE:
        torch.testing.assert_close(getattr(a, field), getattr(b, field), rtol=1e-11, atol=1e-12, msg=field)
    torch.testing.assert_close(ea, eb, rtol=1e-11, atol=1e-11)


def _f32_atoms(batch: Batch) -> Batch:
    for name in ("positions", "velocities", "forces"):
        if name in batch:
            setattr(batch, name, getattr(batch, name).float())
    batch.atomic_masses = batch.atomic_masses.float()
    return batch


def test_mtk_warp_backend_in_float32_with_a_float64_cell() -> None:
    """Float32 atoms under a float64 cell (the kernels work in the atoms' precision and write the
    cell back in its own): both backends stay within float32 rounding of each other."""
    runs = _mtk_runs(False, 30, prepare=_f32_atoms)
    (a, _), (b, _) = runs["warp"], runs["torch"]
    assert a.positions.dtype == torch.float32 and a.cell.dtype == torch.float64
    torch.testing.assert_close(a.positions, b.positions, rtol=0, atol=2e-4)
    torch.testing.assert_close(a.cell, b.cell, rtol=1e-5, atol=1e-5)


def test_crescale_warp_backend_in_float32_with_a_float64_cell() -> None:
    """C-rescale likewise (its noise off, so both backends take the same steps): float32 atoms,
    a float64 cell that moves, the two backends within float32 rounding of each other."""
    final = {}
    for backend in ("torch", "warp"):
        batch = _f32_atoms(_argon_batch(3, strain=1.02))
        initialize_velocities(batch, 40.0, seed=2)
        implementation(NPTCRescale, backend)(ReferenceLJ(), n_steps=30, **_QUIET_CRESCALE).run(batch)
        final[backend] = batch
    a, b = final["warp"], final["torch"]
    assert a.positions.dtype == torch.float32 and a.cell.dtype == torch.float64
    assert (a.cell - _argon_batch(3, strain=1.02).cell).abs().max().item() > 1e-3  # the cell moved
    torch.testing.assert_close(a.positions, b.positions, rtol=0, atol=2e-4)
    torch.testing.assert_close(a.cell, b.cell, rtol=1e-5, atol=1e-5)


def test_mtk_warp_step_replays_its_recorded_launches() -> None:
    """Steps replay recorded launches: a run of 23 steps converts as many tensors for Warp as a
    run of 3 (the integrator's buffers, the batch's fields and its cached parameters stay the same
    objects, so no step after the first ones records a launch again)."""
    from alchemi_integrators import kernel_funcs

    original = kernel_funcs.Launches._to_warp
    counts = []
    for steps in (3, 23):
        batch = _argon_batch(2)
        initialize_velocities(batch, 50.0, seed=1)
        npt = NPTMTK(ReferenceLJ(), dt=5.0, temperature=50.0, tau_p=200.0)
        calls = []

        def counting(self, label, value, calls=calls):
            calls.append(label)
            return original(self, label, value)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(kernel_funcs.Launches, "_to_warp", counting)
            npt.run(batch, n_steps=steps)
        counts.append(len(calls))
    assert counts[0] > 0 and counts[1] == counts[0], counts


def test_targets_per_system_are_fields() -> None:
    """Pressure and temperature may be batch fields: a system at 1 GPa shrinks, one at -0.1 GPa
    grows, from the same start."""
    batch = _argon_batch(2, rattle=0.0)
    batch.set_field("p_target", torch.tensor([1.0, -0.1], dtype=torch.float64) * units.GPA, "system")
    batch.set_field("t_target", torch.tensor([30.0, 30.0], dtype=torch.float64), "system")
    initialize_velocities(batch, 30.0, seed=2)
    v0 = torch.linalg.det(batch.cell).clone()
    NPTCRescale(ReferenceLJ(), n_steps=300, dt=5.0, temperature="t_target", pressure="p_target", tau_t=100.0,
                tau_p=500.0, compressibility=60.0, random_seed=3).run(batch)
    ratio = torch.linalg.det(batch.cell) / v0
    assert ratio[0].item() < 0.97 and ratio[1].item() > 1.0


def test_crescale_is_reproducible_from_its_seed() -> None:
    cells = []
    for _ in range(2):
        batch = _argon_batch(1)
        initialize_velocities(batch, 50.0, seed=4)
        NPTCRescale(ReferenceLJ(), n_steps=20, dt=5.0, temperature=50.0, tau_p=200.0, random_seed=7,
                    anisotropic=True).run(batch)
        cells.append(batch.cell.clone())
    assert torch.equal(cells[0], cells[1])
    assert not torch.allclose(cells[0], _argon_batch(1).cell)


@pytest.mark.parametrize("backend", ["torch", "warp"])
def test_crescale_resumes_from_its_state_dict(backend: str) -> None:
    """C-rescale's draws are keyed by a draw counter that ``state_dict()`` carries: saving it with
    the batch and resuming reproduces the uninterrupted run; resuming without it draws the first
    numbers again and goes elsewhere."""

    def fresh() -> NPTCRescale:
        return implementation(NPTCRescale, backend)(ReferenceLJ(), n_steps=12, dt=5.0, temperature=50.0, tau_t=50.0, tau_p=200.0,
                           compressibility=60.0, anisotropic=True, random_seed=9)

    batch = _argon_batch(2)
    initialize_velocities(batch, 50.0, seed=3)
    resumed, unrestored = resumed_run(fresh, batch)  # batch: the uninterrupted 24 steps
    for field in ("positions", "velocities", "cell"):
        torch.testing.assert_close(getattr(resumed, field), getattr(batch, field), rtol=0, atol=1e-12, msg=field)
    assert (unrestored.cell - batch.cell).abs().max().item() > 1e-9


class _VolumesInStage(Hook):
    """Each step, the volume of every system in status 1, by system_id."""

    stage = DynamicsStage.AFTER_STEP

    def __init__(self) -> None:
        super().__init__()
        self.volumes: dict[int, list[float]] = {}
        self.fmax_on_entry: dict[int, float] = {}

    def __call__(self, batch: Batch, dynamics: object) -> None:
        here = (batch.status == 1).nonzero().view(-1).tolist()
        for s in here:
            sid = int(batch.system_id[s])
            if sid not in self.volumes:
                self.fmax_on_entry[sid] = float(getattr(batch, CELL_FILTER_FMAX)[s])
            self.volumes.setdefault(sid, []).append(float(torch.linalg.det(batch.cell[s])))


@pytest.mark.parametrize("cls", [NPTMTK, NPH, NPTCRescale])
def test_relax_cell_then_npt_in_a_fused_stage(cls: type) -> None:
    """FIRE2 with a Frechet cell filter hands each converged system to NPT in one fused stage:
    every system relaxes (fmax over atoms and cell rows below the threshold), then runs exactly
    its NPT steps with a moving cell, and leaves."""
    batch = _argon_batch(3, rattle=0.1, strain=1.03)
    relax = FIRE2(ReferenceLJ(), n_steps=400, dt=5.0, dt_max=50.0, cell_filter="frechet",
                  convergence_hook=ConvergenceHook.from_fmax(0.01))
    probe = _VolumesInStage()
    md = cls(ReferenceLJ(), n_steps=40, dt=5.0, temperature=50.0, tau_p=500.0, initial_temperature=50.0,
             random_seed=5, hooks=[probe])
    out = FusedStage([(0, relax), (1, md)]).run(batch)
    assert out is not None and (out.status == 2).all()
    assert sorted(probe.volumes) == [0, 1, 2]
    for sid, volumes in probe.volumes.items():
        assert len(volumes) == 40
        assert probe.fmax_on_entry[sid] <= 0.01
        assert max(volumes) - min(volumes) > 1e-3  # the cell moved under NPT


class _MixedSteps(Hook):
    """Counts MTK's steps taken while some system was still in the first stage (status 0)."""

    stage = DynamicsStage.AFTER_STEP

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def __call__(self, batch: Batch, dynamics: object) -> None:
        statuses = set(batch.status.tolist())
        self.steps += int(0 in statuses and 1 in statuses)


#: Each NPT integrator deterministic: MTK as it is, C-rescale with its noise off.
_DETERMINISTIC_NPT = {
    "mtk": lambda backend: implementation(NPTMTK, backend)(ReferenceLJ(), n_steps=40, dt=5.0, temperature=50.0, tau_p=500.0,
                                  initial_temperature=50.0, random_seed=5),
    "nph": lambda backend: implementation(NPH, backend)(ReferenceLJ(), n_steps=40, dt=5.0, temperature=50.0, tau_p=500.0,
                                initial_temperature=50.0, random_seed=5),
    "crescale": lambda backend: implementation(NPTCRescale, backend)(ReferenceLJ(), n_steps=40, initial_temperature=50.0,
                                                                     random_seed=5, **_QUIET_CRESCALE),
}


@pytest.mark.parametrize("kind", sorted(_DETERMINISTIC_NPT))
def test_npt_backends_agree_when_systems_enter_at_different_steps(kind: str) -> None:
    """FIRE2 relaxes three cells and hands each to NPT when it converges: while some systems are
    still relaxing, the NPT kernels must leave them alone. Warp and torch end in the same state."""
    final = {}
    for backend in ("torch", "warp"):
        batch = Batch.from_data_list([_argon_batch(1, rattle=0.1, strain=strain)[0] for strain in (1.0, 1.02, 1.05)])
        mixed = _MixedSteps()
        relax = FIRE2(ReferenceLJ(), n_steps=400, dt=5.0, dt_max=50.0, cell_filter="frechet",
                      convergence_hook=ConvergenceHook.from_fmax(0.01), hooks=[mixed])
        md = _DETERMINISTIC_NPT[kind](backend)
        out = FusedStage([(0, relax), (1, md)]).run(batch)
        assert out is not None and (out.status == 2).all()
        assert mixed.steps > 0  # MTK stepped while other systems were still relaxing
        final[backend] = out
    for field in ("positions", "velocities", "cell"):
        torch.testing.assert_close(getattr(final["warp"], field), getattr(final["torch"], field), rtol=1e-10,
                                   atol=1e-11, msg=field)


def test_crescale_backends_agree_when_the_noise_is_off() -> None:
    """With the thermostat's coupling off (tau_t huge) and the barostat's noise negligible (T near
    0 K), C-rescale is deterministic: the Warp kernels and the torch operations take the same 80
    steps of the pressure-driven cell, isotropic and anisotropic."""
    for anisotropic in (False, True):
        final = {}
        for backend in ("torch", "warp"):
            batch = _argon_batch(3, strain=1.02)
            initialize_velocities(batch, 40.0, seed=2)
            npt = implementation(NPTCRescale, backend)(ReferenceLJ(), n_steps=80, pressure=0.0, anisotropic=anisotropic,
                              **_QUIET_CRESCALE)
            npt.run(batch)
            final[backend] = batch
        assert (torch.linalg.det(final["warp"].cell) / torch.linalg.det(_argon_batch(3, strain=1.02).cell)).min() < 0.995
        for field in ("positions", "velocities", "cell"):
            torch.testing.assert_close(getattr(final["warp"], field), getattr(final["torch"], field), rtol=1e-11,
                                       atol=1e-12, msg=field)


def test_crescale_warp_thermostat_samples_canonical_kinetic_energies() -> None:
    """C-rescale's Warp thermostat holds each system's kinetic energy to the canonical (gamma)
    distribution: over 16 argon cells of 32 atoms at 50 K, the mean temperature is the target
    within 2 % and the kinetic energy's variance is ``N_f (kB T)² / 2`` within 15 %. A short
    ``tau_t`` makes the chi-squared draw carry most of each new kinetic energy, so a wrong one
    shows in the variance."""
    batch = _argon_batch(16, rattle=0.05)
    initialize_velocities(batch, 50.0, seed=6)
    model = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=6.0, shift_energy=True)
    npt = NPTCRescale(model, dt=5.0, temperature=50.0, pressure=0.0, tau_t=1.0, tau_p=500.0, compressibility=60.0,
                      random_seed=8)
    npt.run(batch, n_steps=200)
    samples = []
    for _ in range(150):
        npt.run(batch, n_steps=10)
        samples.append(kinetic_energy(batch).clone())
    ke = torch.stack(samples)  # [samples, systems]
    kt = units.KB * 50.0
    nf = 3 * 32 - 3
    assert abs(ke.mean().item() / (0.5 * nf * kt) - 1) < 0.02
    assert abs(ke.var().item() / (0.5 * nf * kt * kt) - 1) < 0.15


@pytest.mark.parametrize("count", [1, 2, 3, 4, 11, 301])
def test_crescale_draws_the_sum_of_squared_normals_as_chi_squared(count: int) -> None:
    """The thermostat draws the sum of N_f squared normals as the first normal squared plus a
    chi-squared variate of N_f - 1 (twice a Marsaglia-Tsang gamma): over 40,000 keys its mean is
    N_f and its variance 2 N_f (five standard errors), and its distribution is chi-squared (a
    two-sample test against the squares of torch's normals). Counts below 3 take
    the gamma draw's boost for shapes below 1."""
    import warp as wp

    from alchemi_integrators import crescale_kernels, kernel_funcs

    @wp.kernel
    def draw(n: wp.float64, out: wp.array(dtype=wp.float64)):
        i = wp.tid()
        state = crescale_kernels._system_state(7, i, wp.int64(i), 0)
        first = wp.float64(wp.randn(state))
        out[i] = kernel_funcs.sum_of_squared_normals(
            crescale_kernels._system_state(7, i, wp.int64(i), 1), first, n)

    size = 40_000
    out = torch.zeros(size, dtype=torch.float64)
    wp.launch(draw, size, [float(count), wp.from_torch(out)], device="cpu")
    mean, var = out.mean().item(), out.var().item()
    assert abs(mean - count) < 5 * (2 * count / size) ** 0.5
    assert abs(var / (2 * count) - 1) < 5 * (2.0 / size) ** 0.5 * (1 + 6 / count) ** 0.5
    reference = (torch.randn(size, count, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) ** 2).sum(1)
    # Two-sample Kolmogorov-Smirnov: the largest gap of the two empirical CDFs, at 0.1 % significance.
    pooled = torch.cat([out, reference])
    cdfs = [torch.searchsorted(x.sort().values, pooled, right=True) for x in (out, reference)]
    assert (cdfs[0] - cdfs[1]).abs().max().item() / size < 1.95 * (2.0 / size) ** 0.5
