"""LoggingHook: one row per system per logged step, values as in the batch, I/O off the step."""

from __future__ import annotations

import csv
import threading

import numpy as np
import pytest
import torch

from alchemi_core.data import AtomicData, Batch
from alchemi_core.data.datapipes import ListDataset
from alchemi_core.dynamics import DemoDynamics, FusedStage, SizeAwareSampler
from alchemi_core.dynamics.hook import Hook
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.errors import ConfigurationError
from alchemi_core.models.demo import DemoModelWrapper
from alchemi_core.units import AMU_A2_PER_FS2_TO_EV, KB
from alchemi_hooks.errors import HookWorkerError
from alchemi_hooks.logger import COLUMNS, PRESSURE_COLUMNS, LoggingHook


def read_log(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return rows


def expected_rows(records):
    """Rows computed independently (numpy) from what a Recorder saw at the same points."""
    out = []
    for r in records:
        start = np.concatenate(([0], np.cumsum(r["sizes"])))
        for i in np.nonzero(r["in_stage"])[0]:
            sl = slice(start[i], start[i + 1])
            v, m = r["velocities"][sl].astype(np.float64), r["atomic_masses"][sl].astype(np.float64)
            ke = 0.5 * (m * (v**2).sum(1)).sum() * AMU_A2_PER_FS2_TO_EV
            moving = len(m) - (int(r["frozen"][sl].sum()) if "frozen" in r else 0)
            out.append(
                {
                    "step": r["step"],
                    "system_id": int(r["system_id"][i]),
                    "status": int(r["status"][i]),
                    "energy": float(r["energy"][i, 0]),
                    "fmax": float(np.linalg.norm(r["forces"][sl], axis=1).max()),
                    "temperature": 2 * ke / (3 * moving * KB),
                }
            )
    return out


def assert_rows_match(rows, expected):
    assert len(rows) == len(expected)
    key = lambda r: (int(r["step"]), int(r["system_id"]))  # noqa: E731
    for got, want in zip(sorted(rows, key=key), sorted(expected, key=key), strict=True):
        assert int(got["step"]) == want["step"] and int(got["system_id"]) == want["system_id"]
        assert int(got["status"]) == want["status"]
        for col in ("energy", "fmax", "temperature"):
            assert float(got[col]) == pytest.approx(want[col], rel=1e-5, abs=1e-9), col


def test_seed_snippet_runs_and_logs_every_100_steps(tmp_path, monkeypatch):
    from alchemi_core.dynamics.hooks import LoggingHook, MaxForceClampHook

    monkeypatch.chdir(tmp_path)
    model = DemoModelWrapper()
    dynamics = DemoDynamics(
        model=model,
        n_steps=1000,
        dt=0.5,
        hooks=[
            MaxForceClampHook(max_force=10.0),
            LoggingHook(backend="csv", log_path="md_log.csv", frequency=100),
        ],
    )
    torch.manual_seed(0)
    data = AtomicData(atomic_numbers=torch.tensor([6, 8, 1], dtype=torch.long), positions=torch.randn(3, 3))
    batch = Batch.from_data_list([data])
    batch.forces = torch.zeros(3, 3)
    batch.energy = torch.zeros(1, 1)
    dynamics.run(batch)
    rows = read_log(tmp_path / "md_log.csv")
    assert [int(r["step"]) for r in rows] == list(range(0, 1000, 100))
    assert list(rows[0]) == list(COLUMNS)
    assert all(np.isfinite(float(r["energy"])) for r in rows)


def test_csv_has_one_row_per_system_per_logged_step_with_the_batch_values(tmp_path, molecules, recorder):
    batch = molecules([3, 5, 4, 6], speed=0.02, frozen_every=3)
    rec = recorder(frequency=7)
    hook = LoggingHook(log_path=tmp_path / "log.csv", frequency=7)
    DemoDynamics(model=DemoModelWrapper(), n_steps=30, dt=0.5, hooks=[hook, rec]).run(batch)
    rows = read_log(tmp_path / "log.csv")
    assert sorted({int(r["step"]) for r in rows}) == [0, 7, 14, 21, 28]
    assert_rows_match(rows, expected_rows(rec.records))


def test_float64_batches_are_logged_with_full_precision(tmp_path, molecules, recorder):
    batch = molecules([4, 5], dtype=torch.float64)
    rec = recorder(frequency=5)
    hooks = [LoggingHook(log_path=tmp_path / "l.csv", frequency=5), rec]
    DemoDynamics(model=DemoModelWrapper(), n_steps=10, dt=0.5, hooks=hooks).run(batch)
    rows = read_log(tmp_path / "l.csv")
    want = expected_rows(rec.records)
    assert float(rows[-1]["energy"]) == want[-1]["energy"]  # exact round trip


def test_writer_callable_gets_the_same_columns_on_a_background_thread(tmp_path, molecules, recorder):
    got, threads = [], set()

    def writer(columns):
        threads.add(threading.current_thread().name)
        got.append(columns)

    rec = recorder(frequency=4)
    hook = LoggingHook(writer=writer, frequency=4)
    assert hook.log_path is None
    DemoDynamics(model=DemoModelWrapper(), n_steps=12, dt=0.5, hooks=[hook, rec]).run(molecules([3, 4]))
    assert threading.current_thread().name not in threads
    rows = [{c: col[c][i] for c in COLUMNS} for col in got for i in range(len(col["step"]))]
    assert_rows_match(rows, expected_rows(rec.records))
    assert set(got[0]) == set(COLUMNS)


def test_fused_stage_logs_only_its_stage_systems(tmp_path, molecules, recorder):
    batch = molecules([3, 4, 5, 3])
    batch.set_field("status", torch.tensor([0, 1, 0, 1]), "system")
    rec = recorder(frequency=2)
    opt = DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5)
    hooks = [LoggingHook(log_path=tmp_path / "md.csv", frequency=2), rec]
    md = DemoDynamics(model=DemoModelWrapper(), n_steps=8, dt=0.5, hooks=hooks)
    FusedStage([(0, opt), (1, md)]).run(batch)
    rows = read_log(tmp_path / "md.csv")
    assert {int(r["status"]) for r in rows} == {1}
    # Systems 0 and 2 join the MD stage after their 3 optimisation steps.
    early = {int(r["system_id"]) for r in rows if int(r["step"]) == 0}
    late = {int(r["system_id"]) for r in rows if int(r["step"]) == 6}
    assert early == {1, 3} and late == {0, 1, 2, 3}
    assert_rows_match(rows, expected_rows(rec.records))


def test_inflight_refill_logs_the_systems_present_at_each_step(tmp_path, molecule, recorder):
    data = [molecule(n, seed=i) for i, n in enumerate([3, 4, 5, 3, 4, 6, 2])]
    sampler = SizeAwareSampler(ListDataset(data), max_atoms=12, max_batch_size=3, bin_width=1)
    rec = recorder(frequency=2)
    hook = LoggingHook(log_path=tmp_path / "refill.csv", frequency=2)
    DemoDynamics(model=DemoModelWrapper(), n_steps=4, dt=0.5, sampler=sampler, hooks=[hook, rec]).run()
    rows = read_log(tmp_path / "refill.csv")
    assert {int(r["system_id"]) for r in rows} == set(range(7))
    assert_rows_match(rows, expected_rows(rec.records))


def test_a_second_run_appends_without_a_second_header(tmp_path, molecules):
    hook = LoggingHook(log_path=tmp_path / "twice.csv", frequency=5)
    md = DemoDynamics(model=DemoModelWrapper(), n_steps=10, dt=0.5, hooks=[hook])
    md.run(molecules([3, 4]))
    md.run(molecules([3, 4]))
    text = (tmp_path / "twice.csv").read_text()
    assert text.count("step,system_id") == 1
    assert len(read_log(tmp_path / "twice.csv")) == 2 * 2 * 2


def test_a_failing_writer_stops_the_run_with_its_error(molecules):
    def writer(columns):
        raise OSError("disk full")

    md = DemoDynamics(model=DemoModelWrapper(), n_steps=20, dt=0.5, hooks=[LoggingHook(writer=writer, frequency=1)])
    with pytest.raises(HookWorkerError, match="disk full"):
        md.run(molecules([3]))


def test_unknown_backend_names_the_choices():
    with pytest.raises(ConfigurationError, match="'csv'"):
        LoggingHook(backend="tensorboard")


def test_a_fused_stage_hook_logs_systems_of_every_sub_stage_but_not_graduated_ones(tmp_path, molecules):
    batch = molecules([3, 4, 5, 3])
    batch.set_field("status", torch.tensor([0, 1, 0, 1]), "system")
    opt = DemoDynamics(model=DemoModelWrapper(), n_steps=3, dt=0.5)
    md = DemoDynamics(model=DemoModelWrapper(), n_steps=5, dt=0.5)
    hook = LoggingHook(log_path=tmp_path / "all.csv", frequency=1)
    FusedStage([(0, opt), (1, md)], hooks=[hook]).run(batch)
    rows = read_log(tmp_path / "all.csv")
    per_step = {}
    for r in rows:
        per_step.setdefault(int(r["step"]), set()).add(int(r["system_id"]))
    # 1 and 3 run MD for steps 0-4 and graduate; 0 and 2 optimise for 3 steps, then MD to step 7.
    assert per_step == {**{k: {0, 1, 2, 3} for k in range(5)}, **{k: {0, 2} for k in range(5, 8)}}
    assert {int(r["status"]) for r in rows} == {0, 1}


@pytest.mark.parametrize(("fix_com", "removed"), [(True, 3), (False, 0)])
def test_temperature_counts_the_degrees_of_freedom_the_thermostat_uses(tmp_path, fix_com, removed):
    """Langevin(fix_com=True) thermalises 3N - 3 degrees of freedom, and the log divides by them;
    time is the stage's steps times dt; total energy is potential plus kinetic."""
    pytest.importorskip("alchemi_integrators")
    from alchemi_core import registry

    g = torch.Generator().manual_seed(3)
    n = 8
    data = AtomicData(atomic_numbers=torch.full((n,), 18), positions=torch.rand(n, 3, generator=g) * 6,
                      cell=torch.eye(3) * 6.0, pbc=torch.tensor([True, True, True]))
    model = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=2.9)
    path = tmp_path / "log.csv"
    md = registry.build("integrator:langevin", model=model, n_steps=20, dt=2.0, temperature=60.0,
                        initial_temperature=60.0, fix_com=fix_com, random_seed=1,
                        hooks=[LoggingHook(log_path=path, frequency=5)])
    md.run(Batch.from_data_list([data, data]))
    rows = read_log(path)
    assert list(rows[0]) == list(COLUMNS) and len(rows) == 2 * 4
    for r in rows:
        ke = float(r["kinetic_energy"])
        assert float(r["temperature"]) == pytest.approx(2 * ke / ((3 * n - removed) * KB), rel=1e-6)
        assert float(r["total_energy"]) == pytest.approx(float(r["energy"]) + ke, rel=1e-6, abs=1e-9)
        assert float(r["time"]) == pytest.approx((int(r["step"]) + 1) * 2.0)


class _PressureRecorder(Hook):
    """What the NPT integrator's own pressure function gives at the points the log sees."""

    stage = DynamicsStage.AFTER_STEP

    def __init__(self, frequency: int) -> None:
        super().__init__(frequency=frequency)
        self.records: list[dict[str, np.ndarray]] = []

    def __call__(self, batch, dynamics):
        from alchemi_integrators.npt import NPTMTK

        self.records.append({
            "pressure": NPTMTK.pressure_tensor(batch).diagonal(dim1=-2, dim2=-1).mean(-1).numpy().copy(),
            "volume": np.abs(np.linalg.det(batch.cell.double().numpy())),
            "stress": batch.stress.double().numpy().copy(),
        })


def _argon_crystal(a: float, seed: int) -> AtomicData:
    """32 argon atoms on a rattled fcc lattice of side ``2 a`` (Å)."""
    from ase.build import bulk

    atoms = bulk("Ar", "fcc", a=a, cubic=True).repeat(2)
    atoms.rattle(0.05, seed=seed)
    return AtomicData(atomic_numbers=torch.as_tensor(atoms.numbers), positions=torch.as_tensor(atoms.positions),
                      cell=torch.as_tensor(atoms.cell.array), pbc=torch.tensor([True, True, True]))


def _assert_pressure_columns_match(columns, records):
    assert len(columns) == len(records)
    voigt = ((0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1))
    for got, want in zip(columns, records, strict=True):
        np.testing.assert_allclose(got["pressure"], want["pressure"], rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(got["volume"], want["volume"], rtol=1e-12)
        for name, (i, j) in zip(PRESSURE_COLUMNS[2:], voigt, strict=True):
            np.testing.assert_allclose(got[name], want["stress"][:, i, j], rtol=1e-12, atol=1e-15)


def test_an_nvt_run_logs_pressure_volume_and_stress_when_asked_without_a_stress_flag(tmp_path):
    """``LoggingHook(pressure=True)`` makes a Langevin run ask the LJ model for stress; the logged
    pressure is the barostats' ``(sum m v v^T)/V - stress`` trace over three, volume is det(cell)."""
    pytest.importorskip("alchemi_integrators")
    from alchemi_core import registry

    model = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5)
    columns = []
    path = tmp_path / "log.csv"
    log = LoggingHook(log_path=path, frequency=5, pressure=True, writer=columns.append)
    truth = _PressureRecorder(frequency=5)
    md = registry.build("integrator:langevin", model=model, n_steps=20, dt=2.0, temperature=60.0,
                        initial_temperature=60.0, random_seed=1, hooks=[log, truth])
    md.run(Batch.from_data_list([_argon_crystal(5.26, 0), _argon_crystal(5.4, 1)]))
    _assert_pressure_columns_match(columns, truth.records)
    assert np.abs(np.concatenate([c["stress_xx"] for c in columns])).max() > 1e-6  # the model's stress is in it
    rows = read_log(path)
    assert list(rows[0]) == [*COLUMNS, *PRESSURE_COLUMNS] and len(rows) == 2 * 4
    assert {int(r["status"]) for r in rows} == {0}


def test_pressure_of_non_interacting_atoms_is_the_ideal_gas_2k_over_3v(tmp_path):
    """Atoms farther apart than the cutoff feel no force and no stress: P = 2 K / (3 V)."""
    pytest.importorskip("alchemi_integrators")
    from alchemi_core import registry

    model = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=5.0)
    data = AtomicData(atomic_numbers=torch.full((2,), 18),
                      positions=torch.tensor([[1.0, 1.0, 1.0], [11.0, 11.0, 11.0]], dtype=torch.float64),
                      cell=torch.diag(torch.tensor([20.0, 21.0, 22.0], dtype=torch.float64)),
                      pbc=torch.tensor([True, True, True]))
    columns = []
    md = registry.build("integrator:velocity-verlet", model=model, n_steps=4, dt=1.0, initial_temperature=300.0,
                        random_seed=2, hooks=[LoggingHook(writer=columns.append, frequency=2, pressure=True)])
    md.run(Batch.from_data_list([data]))
    assert len(columns) == 2
    for c in columns:
        assert float(c["volume"][0]) == pytest.approx(20.0 * 21.0 * 22.0, rel=1e-12)
        assert float(c["kinetic_energy"][0]) > 0
        assert float(c["pressure"][0]) == pytest.approx(2 * float(c["kinetic_energy"][0]) / (3 * 9240.0), rel=1e-9)


def test_an_npt_run_logs_pressure_by_default_as_its_barostat_computes_it():
    """Without ``pressure=`` the hook logs pressure where the stage computes stress anyway."""
    pytest.importorskip("alchemi_integrators")
    from alchemi_core import registry

    model = registry.build("model:lennard-jones", epsilon=0.0104, sigma=3.405, cutoff=8.5)
    columns = []
    log = LoggingHook(writer=columns.append, frequency=3)
    assert not log.needs_stress
    truth = _PressureRecorder(frequency=3)
    md = registry.build("integrator:npt-mtk", model=model, n_steps=9, dt=2.0, temperature=50.0, pressure=0.0,
                        tau_t=100.0, tau_p=500.0, initial_temperature=50.0, random_seed=1, hooks=[log, truth])
    md.run(Batch.from_data_list([_argon_crystal(5.3, 0)]))
    _assert_pressure_columns_match(columns, truth.records)


def test_pressure_true_refuses_molecules_naming_the_fix(molecules):
    with pytest.raises(ConfigurationError, match="stress"):
        DemoDynamics(model=DemoModelWrapper(), n_steps=2, dt=0.5,
                     hooks=[LoggingHook(writer=lambda c: None, pressure=True)]).run(molecules([3, 2]))
