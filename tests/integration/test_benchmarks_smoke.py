"""The benchmark harness (``python -m benchmarks``) keeps working: the alchemi side of every
workload at tiny size on the CPU with every correctness check passing, and the pieces the
figures rest on (temperature, drift, the independent force, FIRE's parameter mapping, ratios,
the W4 report) checked against references.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("alchemi_potentials")
pytest.importorskip("alchemi_integrators")

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # benchmarks/ is a folder of the repository, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks import cli, spec  # noqa: E402
from benchmarks.adapters import load  # noqa: E402
from benchmarks.adapters.base import Unavailable  # noqa: E402
from benchmarks.harness import Context, attempt, ratios  # noqa: E402
from benchmarks.physics import EnergyRecorder, nve_drift, temperature_check  # noqa: E402
from benchmarks.reference import largest_forces  # noqa: E402
from benchmarks.structures import ArgonCells, fcc_argon, maxwell_boltzmann, replicated_crystal  # noqa: E402
from benchmarks.timing import Budget, DeadlineExceeded  # noqa: E402


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "quick.json"
    assert cli.main(["--quick", "--device", "cpu", "--frameworks", "alchemi", "--json", str(out)]) == 0
    return {f"{c['id']}:{c['case']}": c for c in json.loads(out.read_text())["workloads"]}


def _alchemi(case: dict) -> dict:
    r = case["results"]["alchemi"]
    assert r["status"] == "ok", r
    return r


def test_quick_run_covers_every_workload(quick_run: dict) -> None:
    assert {key.split(":")[0] for key in quick_run} == {"W1", "W2", "W3", "W5", "W6"}


def test_md_workloads_hold_50_kelvin_and_conserve_energy(quick_run: dict) -> None:
    for key in ("W1:108x2", "W6:108x4"):
        r = _alchemi(quick_run[key])
        t = r["temperature"]
        assert t["passed"] and abs(t["mean_K"] - 50.0) < 1.0, t
        assert abs(r["nve"]["slope_meV_per_atom_ps"]) < 1.0, r["nve"]
        assert r["atom_steps_per_s"] == pytest.approx(quick_run[key]["params"]["atoms"] * r["steps_per_s"])


def test_relaxation_converges_every_cell(quick_run: dict) -> None:
    r = _alchemi(quick_run["W2:8x108"])
    assert r["forces"]["passed"] and r["forces"]["max_fmax"] <= spec.FIRE.fmax * 1.001
    assert r["count"] == {"in": 8, "out": 8, "passed": True}
    assert 0 < r["steps"] < 100


def test_inflight_drains_every_structure_once(quick_run: dict) -> None:
    r = _alchemi(quick_run["W3:24 cells"])
    assert r["count"]["passed"] and r["count"]["distinct"] == 24
    assert r["relaxed"] == {"converged": 24, "of": 24, "passed": True}


def test_snapshots_are_all_in_the_store(quick_run: dict) -> None:
    r = _alchemi(quick_run["W5:108x4"])
    assert r["records"]["passed"] and r["records"]["written"] > 0


def test_temperature_ignores_centre_of_mass_motion() -> None:
    counts = torch.full((64,), 108)
    v = maxwell_boltzmann(counts, 50.0, seed=3)
    masses = torch.full((v.shape[0],), spec.ARGON_MASS, dtype=torch.float64)
    idx = torch.repeat_interleave(torch.arange(64), counts)
    still, drifting = EnergyRecorder(), EnergyRecorder()
    still.observe(v, masses, idx, 64, torch.zeros(64))
    drifting.observe(v + torch.tensor([0.01, 0.0, 0.0]), masses, idx, 64, torch.zeros(64))
    t_still = temperature_check(still.result()["ke_internal"], counts, 50.0)
    t_drift = temperature_check(drifting.result()["ke_internal"], counts, 50.0)
    assert t_still["mean_K"] == pytest.approx(t_drift["mean_K"], rel=1e-9)
    assert abs(t_still["mean_K"] - 50.0) < 1.5  # 64 x 108 atoms: 1 % standard deviation
    assert temperature_check(still.result()["ke_internal"], counts, 40.0)["passed"] is False


def test_temperature_verdict_separates_failure_from_too_few_samples() -> None:
    counts = torch.tensor([108])
    dof_kb = (3 * 108 - 3) * spec.BOLTZMANN / 2.0
    steady = torch.full((40, 1), 47.0 * dof_kb, dtype=torch.float64)  # 6 % low, no noise
    assert temperature_check(steady, counts, 50.0)["verdict"] == "FAIL"
    noisy = steady * (1.0 + 0.3 * torch.randn(40, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    check = temperature_check(noisy, counts, 50.0)
    assert not check["passed"] or check["verdict"] == "pass"
    assert check["verdict"] in ("inconclusive", "pass") and check["stderr_K"] > 1.0


def test_recorder_slices_atoms_without_changing_the_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    """observe() works through atoms in slices (bounded temporaries); a slice boundary inside a
    system and systems in several slices must give the one-pass sums."""
    import benchmarks.physics as physics

    counts = torch.tensor([5, 108, 1, 40])
    v = maxwell_boltzmann(counts, 50.0, seed=1) + 0.003
    masses = torch.rand(v.shape[0], generator=torch.Generator().manual_seed(2), dtype=torch.float64) + 10.0
    idx = torch.repeat_interleave(torch.arange(4), counts)
    whole = EnergyRecorder()
    whole.observe(v, masses, idx, 4, torch.arange(4.0))
    monkeypatch.setattr(physics, "OBSERVE_SLICE", 7)
    sliced = EnergyRecorder()
    sliced.observe(v, masses, idx, 4, torch.arange(4.0))
    for key in ("ke_internal", "ke_total", "potential"):
        assert torch.allclose(whole.result()[key], sliced.result()[key], rtol=1e-12, atol=0.0)
    m = masses.reshape(-1, 1)
    ke1 = float((0.5 * m[5:113] * v[5:113] ** 2).sum() - 0.5 * ((m[5:113] * v[5:113]).sum(0) ** 2).sum() / m[5:113].sum())
    assert sliced.result()["ke_internal"][0, 1].item() == pytest.approx(ke1 * physics.AMU_A2_PER_FS2_TO_EV, rel=1e-10)


def test_velocities_in_other_time_units_give_the_same_temperature() -> None:
    counts = torch.tensor([108])
    v = maxwell_boltzmann(counts, 50.0, seed=0)
    masses = torch.full((108,), spec.ARGON_MASS, dtype=torch.float64)
    idx = torch.zeros(108, dtype=torch.long)
    fs, internal = EnergyRecorder(), EnergyRecorder()
    fs.observe(v, masses, idx, 1, torch.zeros(1))
    internal.observe(v * spec.INTERNAL_TIME_FS, masses, idx, 1, torch.zeros(1), velocity_unit_fs=spec.INTERNAL_TIME_FS)
    assert torch.allclose(fs.result()["ke_total"], internal.result()["ke_total"], rtol=1e-12)


def test_nve_drift_recovers_a_known_slope() -> None:
    samples, systems, atoms = 50, 4, 4 * 108
    t_fs = torch.arange(samples, dtype=torch.float64) * 50.0
    drift = 2e-3 * 108 * t_fs / 1000.0  # 2 meV/atom/ps per system
    ke = torch.zeros(samples, systems, dtype=torch.float64)
    pot = (drift.unsqueeze(1) - 900.0).repeat(1, systems)
    out = nve_drift(ke, pot, atoms, 50.0)
    assert out["slope_meV_per_atom_ps"] == pytest.approx(2.0, rel=1e-9)
    assert out["max_excursion_meV_per_atom"] == pytest.approx(2.0 * t_fs[-1].item() / 1000.0, rel=1e-9)


def test_reference_forces_match_ase() -> None:
    from ase.calculators.lj import LennardJones

    cells = ArgonCells([2, 3])
    systems = cells.systems()
    fmax = largest_forces(systems.positions, systems.cells, systems.counts, "cpu")
    for i, atoms in enumerate(systems.to_ase()):
        atoms.calc = LennardJones(sigma=spec.SIGMA, epsilon=spec.EPSILON, rc=spec.CUTOFF, smooth=False)
        expected = float((atoms.get_forces() ** 2).sum(axis=1).max() ** 0.5)
        assert fmax[i].item() == pytest.approx(expected, rel=1e-9)


def test_fire_parameters_reproduce_ases_fire() -> None:
    """alchemi's FIRE with spec.FIRE's fs values takes the steps ASE's FIRE takes with its own
    defaults: the parameter mapping every framework's W2 rests on."""
    from ase.calculators.lj import LennardJones
    from ase.optimize import FIRE

    systems = ArgonCells([3]).systems()
    atoms = systems.to_ase()[0]
    atoms.calc = LennardJones(sigma=spec.SIGMA, epsilon=spec.EPSILON, rc=spec.CUTOFF, smooth=False)
    opt = FIRE(atoms, dt=spec.FIRE.dt_ase, dtmax=spec.FIRE.dt_max_ase, maxstep=spec.FIRE.maxstep, logfile=None)
    opt.run(fmax=spec.FIRE.fmax, steps=500)
    ours = load("alchemi").relax(systems, "cpu", 500, None)
    assert ours.steps == opt.nsteps
    assert torch.allclose(ours.positions, torch.tensor(atoms.positions), atol=2e-3)


def test_ratios_are_alchemi_over_each_peer() -> None:
    results = {
        "alchemi": {"status": "ok", "seconds": 0.5, "rate": 8.0},
        "nvalchemi": {"status": "ok", "seconds": 2.0, "rate": 2.0},
        "torchsim": {"status": "timed out", "reason": "cap"},
    }
    assert ratios(results, "rate", higher_is_better=True) == {"nvalchemi": 4.0}
    assert ratios(results, "seconds", higher_is_better=False) == {"nvalchemi": 4.0}
    assert ratios({**results, "alchemi": {"status": "error"}}, "rate", True) == {}


def test_attempt_reports_every_failure(tmp_path: Path) -> None:
    class Stub:
        name, version, notes = "stub", "0", ""

    ctx = Context("cpu", True, Budget(60.0), {"a": Stub(), "b": "not installed"}, tmp_path, log=lambda s: None)

    def unavailable(fw, deadline):
        raise Unavailable("no FIRE")

    def too_slow(fw, deadline):
        raise DeadlineExceeded

    def broken(fw, deadline):
        raise ValueError("bad shape")

    assert attempt(ctx, "b", 10, too_slow) | {"wall_s": 0} == {
        "status": "unavailable",
        "reason": "not installed",
        "wall_s": 0,
    }
    assert attempt(ctx, "a", 10, unavailable)["reason"] == "no FIRE"
    assert attempt(ctx, "a", 10, too_slow)["status"] == "timed out"
    failed = attempt(ctx, "a", 10, broken)
    assert failed["reason"] == "ValueError: bad shape"
    assert "in broken" in failed["traceback"] and failed["traceback"].rstrip().endswith("ValueError: bad shape")
    assert attempt(ctx, "a", 10, lambda fw, d: {"x": 1})["status"] == "ok"
    ctx.budget = Budget(0.0)
    assert attempt(ctx, "a", 10, lambda fw, d: {"x": 1})["status"] == "skipped"


def test_workload_names_expand_and_reject_typos() -> None:
    assert cli.expand(["W1"]) == [f"W1:{a}x{s}" for a, s in spec.W1_SHAPES]
    assert cli.expand(["w6:864x1", "W2"]) == ["W6:864x1", "W2"]
    with pytest.raises(SystemExit, match="unknown"):
        cli.expand(["W7"])
    with pytest.raises(SystemExit, match="torchrun"):
        cli.expand(["W4"])
    with pytest.raises(SystemExit, match="ATOMSxSYSTEMS"):
        cli.expand(["W1:108"])


def test_a_variant_and_a_tuning_hold_for_the_whole_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--variant`` sets benchmarks.spec's values for the run and puts them back; ``--tuning``
    reaches the alchemi adapter, which passes its Tuning to the model it builds."""
    seen: list[tuple[float, float, int]] = []

    def fake_run_one(ctx: Context, item: str, args: object) -> dict:
        model = ctx.frameworks["alchemi"].model("cpu")
        seen.append((model.neighbor_list.skin, spec.COLUMNS_HEADROOM, spec.neighbor_columns(spec.CUTOFF + 1.0)))
        return {"id": "W6", "case": item, "title": item, "params": {}, "metric": "ms_per_step", "results": {},
                "ratios": {}}

    monkeypatch.setattr(cli, "run_one", fake_run_one)
    headroom = spec.COLUMNS_HEADROOM
    out = tmp_path / "v.json"
    variant, tuning = "benchmarks.spec:COLUMNS_HEADROOM=1.3", "skin=0.7,run_ahead=True"
    argv = ["--device", "cpu", "--frameworks", "alchemi", "--workloads", "W6:108x4,W6:864x1", "--json", str(out)]
    assert cli.main([*argv, "--variant", variant, "--tuning", tuning]) == 0
    assert seen == [(0.7, 1.3, 136)] * 2  # both cases; 112 columns at the default headroom
    assert headroom == spec.COLUMNS_HEADROOM
    args = json.loads(out.read_text())["meta"]["args"]
    assert (args["variant"], args["tuning"]) == (variant, tuning)
    for bad in (["--variant", "neighbors.layout:SKIN[cpu]=1"], ["--tuning", "no_such_name=1"],
                ["--tuning", "unroll=3"]):
        with pytest.raises(SystemExit):
            cli.main([*argv, *bad])


def test_w4_json_is_reported_with_its_speedup(tmp_path: Path) -> None:
    from alchemi_core.errors import InvalidDataError
    from benchmarks import w4_report

    def write(name: str, mode: str, per_hour: float) -> str:
        path = tmp_path / name
        path.write_text(
            json.dumps(
                {
                    "workload": "W4",
                    "mode": mode,
                    "structures_in": 100,
                    "structures_out": 100,
                    "converged": 100,
                    "seconds": 3600 * 100 / per_hour,
                    "structures_per_hour": per_hour,
                }
            )
        )
        return str(path)

    case = w4_report.run_case([write("w4.json", "pipeline", 9.0e6), write("w3.json", "fused", 5.0e6)])
    assert case["speedup_over_fused"] == pytest.approx(1.8)
    assert case["results"]["alchemi pipeline"]["count"]["passed"]
    (tmp_path / "bad.json").write_text(json.dumps({"mode": "pipeline"}))
    with pytest.raises(InvalidDataError, match="missing"):
        w4_report.load([str(tmp_path / "bad.json")])


def test_inputs_are_the_documented_ones() -> None:
    crystal = replicated_crystal(108, 3, 50.0, seed=0)
    assert crystal.num_atoms == 324 and crystal.cells[0, 0, 0].item() == pytest.approx(3 * spec.LATTICE)
    com = torch.zeros(3, 3, dtype=torch.float64).index_add_(0, crystal.system_index, crystal.velocities)
    assert com.abs().max() < 1e-12
    cells = ArgonCells.drawn(50)
    assert set(cells.repeats.tolist()) <= set(spec.W3_REPEATS)
    pos, _ = cells.cell(7)
    again, _ = ArgonCells(cells.repeats).cell(7)
    assert torch.equal(pos, again)  # seeded by the index
    rattle = pos - torch.from_numpy(fcc_argon(int(cells.repeats[7]))[0])
    assert rattle.std().item() == pytest.approx(spec.RATTLE, rel=0.15)
    assert math.isclose(spec.FIRE.dt_fs, 0.1 * math.sqrt(spec.ARGON_MASS) * spec.INTERNAL_TIME_FS)


@pytest.mark.gpu
def test_quick_run_on_the_gpu(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    out = tmp_path / "gpu.json"
    assert (
        cli.main(
            [
                "--quick",
                "--device",
                "cuda",
                "--frameworks",
                "alchemi",
                "--json",
                str(out),
                "--workloads",
                "W1:108x2,W2,W3,W5",
            ]
        )
        == 0
    )
    for case in json.loads(out.read_text())["workloads"]:
        r = case["results"]["alchemi"]
        assert r["status"] == "ok", (case["id"], r)
        for check in ("temperature", "forces", "count", "relaxed", "records"):
            if check in r:
                assert r[check]["passed"], (case["id"], check, r[check])
        if case["id"] == "W1":
            assert r["peak_bytes_per_atom"] is not None and r["peak_bytes_per_atom"] > 0


@pytest.mark.parametrize(
    "module",
    [
        "spec",
        "structures",
        "timing",
        "physics",
        "reference",
        "harness",
        "report",
        "w1_nvt",
        "w2_relax",
        "w3_inflight",
        "w4_report",
        "w5_snapshots",
        "adapters",
        "adapters.base",
        "adapters.alchemi",
        "tools.check_ops",
        "tools.repeat_memory",
    ],
)
def test_docstring_examples_run(module: str) -> None:
    import doctest
    import importlib

    name = module if module.startswith("tools.") else f"benchmarks.{module}"
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_check_ops_counts_what_the_checks_of_a_relaxation_launch() -> None:
    from tools.check_ops import count

    report = count(8, "cpu")
    parts, converged = report["parts"], report["converged_checks"]
    assert converged >= 1 and parts["total"]["ops"] > 0
    assert parts["rest_after_optimisers"]["calls"] == converged  # once per check where one converged
    assert parts["init_entering"]["calls"] == 1  # the run's start only: converged systems leave
    # Only the values read from the masks are rebuilt (and copied into place) after a convergence.
    assert parts.get("derived_copy", {"calls": 0})["calls"] <= converged


def test_repeat_memory_reports_every_run(tmp_path: Path) -> None:
    from tools import repeat_memory

    out = tmp_path / "runs.json"
    repeat_memory.main(["--cells", "4", "--runs", "2", "--device", "cpu", "--json", str(out)])
    rows = json.loads(out.read_text())["runs"]
    assert [r["gc_first"] for r in rows] == [False, True]
    assert all(r["steps"] > 0 and r["seconds"] > 0 and r["device_allocs"] is None for r in rows)


def test_an_inflight_drain_past_its_deadline_reports_what_it_did() -> None:
    import time

    out = load("alchemi").inflight(ArgonCells.drawn(8, (2,)), "cpu", 50, deadline=time.perf_counter())
    assert out.completed is False and out.seconds > 0
    assert len(out.ids_out) < 8  # stopped within its first steps, long before 50 MD steps


@pytest.mark.parametrize("repeat", [1, 3])
def test_fcc_argon_is_ases_cubic_fcc_cell_repeated(repeat: int) -> None:
    """The harness builds its crystals without ASE; they must be ASE's, atom for atom."""
    build = pytest.importorskip("ase.build")
    atoms = build.bulk("Ar", "fcc", a=spec.LATTICE, cubic=True).repeat((repeat, repeat, repeat))
    positions, cell = fcc_argon.__wrapped__(repeat)
    np.testing.assert_allclose(positions, atoms.positions, atol=1e-12)
    np.testing.assert_allclose(cell, atoms.cell.array, atol=1e-12)


def test_w3_data_parallel_smoke_stores_every_cell_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("alchemi_zarr")
    from benchmarks import w3_data_parallel

    monkeypatch.chdir(tmp_path)
    w3_data_parallel.main(["--smoke", "--json", "dp.json", "--keep"])
    record = json.loads((tmp_path / "dp.json").read_text())
    assert record["complete"] and (record["ranks"], record["stored"], record["duplicated"]) == (1, 16, 0)
    with pytest.raises(SystemExit, match="already holds results"):  # a timed run starts from an empty store
        w3_data_parallel.main(["--smoke"])


def test_w8_quick_relaxes_every_strained_cell_and_runs_npt(tmp_path) -> None:
    """W8 at tiny sizes on the CPU: every strained, rattled cell converges (fmax over atoms and
    cell rows at most 0.05 eV/Å, cells out = cells in) and both barostats step."""
    import json

    from benchmarks import w8_cell

    path = tmp_path / "w8.json"
    assert w8_cell.main(["--quick", "--device", "cpu", "--frameworks", "alchemi", "--repeats", "1",
                         "--json", str(path)]) == 0
    out = json.loads(path.read_text())
    relax = out["relax"]["alchemi"]
    assert relax["converged"] == 16 and relax["count"] == {"in": 16, "out": 16}
    assert relax["max_fmax"] <= 0.05
    for kind in ("mtk", "crescale"):
        assert out["npt"][f"alchemi-{kind}"]["steps_per_s"] > 0


@pytest.mark.slow
def test_w11_quick_relaxes_every_strained_cell_in_ases_steps(tmp_path) -> None:
    """W11 at tiny size on the CPU (ASE's EMT on both sides): every strained, rattled Cu cell
    converges under L-BFGS with the Frechet filter, in no more steps than ASE's LBFGS + 10 %."""
    import json

    from benchmarks import w11_lbfgs

    path = tmp_path / "w11.json"
    out = w11_lbfgs.main(["--quick", "--model", "emt", "--device", "cpu", "--json", str(path)])
    assert json.loads(path.read_text())["met"] == out["met"]
    assert out["met"]["every_structure_converged"] and out["met"]["steps_over_ase"]
    assert out["alchemi"]["count"] == {"in": 4, "out": 4}


def test_the_phase_timer_counts_each_call_once_and_puts_the_methods_back():
    from alchemi_core.dynamics import DemoDynamics
    from alchemi_core.dynamics.checks import Checks
    from alchemi_core.dynamics.masks import Masks
    from alchemi_core.dynamics.step import StepLoop
    from alchemi_core.models.demo import DemoModelWrapper
    from alchemi_core.testing import make_batch, never_converging
    from tools.phases import PhaseTimer

    check, core, update = Checks.__dict__["check"], StepLoop.__dict__["_core"], Masks.__dict__["update"]
    timer = PhaseTimer("cpu")
    timer.wrap(Checks, "check", nested=True)
    timer.wrap(StepLoop, "_core")
    timer.wrap(Masks, "update")
    try:
        DemoDynamics(model=DemoModelWrapper(), n_steps=6, dt=0.5,
                     convergence_hook=never_converging(frequency=2)).run(make_batch([3, 4]))
        totals = timer.totals()
    finally:
        timer.restore()
    # The masks are written at the run's start and after its start hooks; the checks that change
    # nothing keep them.
    assert totals["_core"][0] == 6 and totals["check"][0] == 3 and totals["update"][0] == 2
    assert all(ms >= 0 for _, ms in totals.values())
    assert Checks.__dict__["check"] is check and StepLoop.__dict__["_core"] is core
    assert Masks.__dict__["update"] is update


def test_profile_calls_profiles_only_inside_checks_and_puts_check_back():
    from alchemi_core.dynamics import DemoDynamics
    from alchemi_core.dynamics.checks import Checks
    from alchemi_core.models.demo import DemoModelWrapper
    from alchemi_core.testing import make_batch, never_converging
    from tools.phases import profile_calls

    check = Checks.__dict__["check"]
    run = DemoDynamics(model=DemoModelWrapper(), n_steps=6, dt=0.5, convergence_hook=never_converging(frequency=2))
    text = profile_calls(Checks, "check", lambda: run.run(make_batch([3, 4])))
    assert Checks.__dict__["check"] is check
    # Three checks, each profiled once (the row of checks.py's check reads "3 ... (check)").
    assert any(line.split()[:1] == ["3"] and line.endswith("(check)") for line in text.splitlines())
    assert "(_core)" not in text  # the steps between checks are not profiled


def test_store_append_times_each_way_in_alternating_rounds_and_restores_the_defaults(tmp_path) -> None:
    from alchemi_zarr import chunks, local_files
    from tools import store_append

    result = store_append.main(["--chunk-kib", "512", "--via", "zarr,files", "--file-threads", "1,2",
                                "--rounds", "2", "--repeats", "1", "--json", str(tmp_path / "a.json")])
    row = result["chunks"][512]
    ways = ["append_ms_via_zarr", "append_ms_via_files_t1", "append_ms_via_files_t2"]
    assert all(row[w] > 0 and len(row["rounds_ms"][w]) == 2 for w in ways)
    assert row["plain_files_ms"] > 0
    assert chunks.LOCAL_FILES is True and local_files.FILE_THREADS == 4


def test_a_shape_argon_cannot_fill_is_refused_before_anything_runs() -> None:
    """``--workloads`` lists are checked whole before the first case: a W1 shape that is not an FCC
    argon cell (4 n^3 atoms) is named in the error, also after good shapes."""
    assert cli.expand(["W1:256x4", "W1:4000000x1"]) == ["W1:256x4", "W1:4000000x1"]
    with pytest.raises(SystemExit, match="W1:4194304x1.*4 n\\^3"):
        cli.expand(["W1:256x1024", "W1:4194304x1"])


def test_prepare_times_its_parts_only_inside_the_start_and_puts_the_methods_back():
    from alchemi_core.dynamics.engine import Engine
    from alchemi_potentials.neighbors.layout import Layout
    from tools.phases import prepare, prepare_parts

    before = (Engine.__dict__.get("prepare"), Layout.__dict__["__init__"])
    report = prepare("cpu", repeats=2, cells=4)
    for label in ("synchronised", "host"):
        parts = report[label]
        # Every part runs inside the start, timed there only.
        assert set(parts) == {"prepare", *(name for _, name in prepare_parts())}
        assert parts["update"] >= parts["__init__"]
        assert parts["prepare"] >= parts["check_batch"] + parts["setup"]
        assert len(report[f"{label}_run_ms"]) == 2
        assert report[f"{label}_calls"]["prepare"] == 1
    assert (Engine.__dict__.get("prepare"), Layout.__dict__["__init__"]) == before


def test_tools_readme_lists_every_diagnostic_with_a_command_that_parses(monkeypatch, capsys) -> None:
    """``tools/README.md`` has one row per module of ``tools/``, each with a ``python -m tools.<name>``
    command whose module imports and whose options parse (``--help``)."""
    import importlib
    import re

    tools = ROOT / "tools"
    rows = re.findall(r"^\| `(\w+)` \| .+ \| `python -m tools\.(\w+)[ `]", (tools / "README.md").read_text(), re.M)
    assert rows and all(name == command for name, command in rows)
    assert sorted(name for name, _ in rows) == sorted(p.stem for p in tools.glob("*.py") if p.stem != "__init__")
    for name, _ in rows:
        main = importlib.import_module(f"tools.{name}").main
        monkeypatch.setattr(sys, "argv", [f"tools.{name}", "--help"])
        with pytest.raises(SystemExit) as exit_:
            main() if name == "engine_overhead" else main(["--help"])
        assert exit_.value.code == 0 and "usage:" in capsys.readouterr().out, name
