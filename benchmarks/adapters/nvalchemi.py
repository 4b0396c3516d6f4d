"""nvalchemi-toolkit (NVIDIA), driven through its public API as its documentation shows:
``LennardJonesModelWrapper`` with a ``NeighborListHook`` at ``BEFORE_COMPUTE`` (skin 0.5 Å,
``spec.SKIN``; the hook's default is 0, a rebuild every step; alchemi's own default is 1.0 Å, and
nvalchemi's times do not depend on it between 0.5 and 1.0 Å: docs/performance.md), ``NVTLangevin`` /
``NVE`` / ``FIRE`` and ``BaseDynamics.run``; W3 with ``FusedStage`` fed by its
``SizeAwareSampler``. Its kernels take times in sqrt(amu Å²/eV) (10.18 fs): FIRE's time steps
are converted here (its MD integrators convert fs themselves), and its velocities are in Å per
that unit.

One model and one neighbour-list hook serve every workload on a device: the hook compiles with
``torch.compile`` on its first call and for new shapes, and sharing it is the cheapest way to
use it (its Verlet-skin test rebuilds whatever moved, so reuse is exact).

Forces are primed before a run the way its ``FusedStage.run`` does it (the neighbour-list hooks,
then ``compute``): its ``BaseDynamics.run`` would otherwise take its first step with the zero
forces of a fresh batch.
"""

from __future__ import annotations

import importlib.util
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from benchmarks import spec
from benchmarks.adapters.base import (
    Framework,
    IdTally,
    InflightOutcome,
    MDRun,
    ObservedMD,
    RelaxOutcome,
    Unavailable,
)
from benchmarks.timing import check_deadline, timed, timed_until_deadline

try:
    from nvalchemi.data import AtomicData, Batch
    from nvalchemi.dynamics import NVE, FusedStage, NVTLangevin, SizeAwareSampler
    from nvalchemi.dynamics.base import ConvergenceHook, DynamicsStage
    from nvalchemi.dynamics.optimizers.fire import FIRE
    from nvalchemi.dynamics.sinks import DataSink
    from nvalchemi.hooks import NeighborListHook
    from nvalchemi.models.lj import LennardJonesModelWrapper
except Exception as exc:  # noqa: BLE001 - any import failure of a peer is a reason to report
    raise Unavailable(f"nvalchemi-toolkit not importable: {type(exc).__name__}: {exc}") from exc

if TYPE_CHECKING:
    from benchmarks.physics import EnergyRecorder
    from benchmarks.structures import ArgonCells, Systems

REFILL_EVERY = 5
DEADLINE_EVERY = 10


class _Observe:
    """An nvalchemi hook handing velocities and energies to an ``EnergyRecorder``."""

    stage = DynamicsStage.AFTER_STEP

    def __init__(self, every: int) -> None:
        self.frequency = every
        self.target: EnergyRecorder | None = None

    def __call__(self, ctx: Any, stage: Any) -> None:
        b = ctx.batch
        if self.target is not None:
            self.target.observe(
                b.velocities,
                b.atomic_masses,
                b.batch_idx,
                b.num_graphs,
                b.energy,
                velocity_unit_fs=spec.INTERNAL_TIME_FS,
            )


class _Deadline:
    """An nvalchemi hook that stops a run past its time cap (host clock only)."""

    stage = DynamicsStage.AFTER_STEP
    frequency = DEADLINE_EVERY

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline

    def __call__(self, ctx: Any, stage: Any) -> None:
        check_deadline(self.deadline)


class _ConvergedCount:
    """Counts systems the relaxation released by convergence."""

    stage = DynamicsStage.ON_CONVERGE
    frequency = 1

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, ctx: Any, stage: Any) -> None:
        if ctx.converged_mask is not None:
            self.count += int(ctx.converged_mask.sum())


class _IdTally(IdTally, DataSink):
    """The ``system_id`` of every structure that graduated."""

    def write(self, batch: Batch, mask: torch.Tensor | None = None) -> None:
        self.add(batch.system_id, mask)


def _data(pos: torch.Tensor, cell: torch.Tensor, vel: torch.Tensor | None, device: str) -> AtomicData:
    n = len(pos)
    v = torch.zeros(n, 3) if vel is None else vel * spec.INTERNAL_TIME_FS
    return AtomicData(
        positions=pos.to(device, torch.float32),
        atomic_numbers=torch.full((n,), spec.ARGON_Z, dtype=torch.long, device=device),
        atomic_masses=torch.full((n,), spec.ARGON_MASS, dtype=torch.float32, device=device),
        cell=cell.to(device, torch.float32).unsqueeze(0),
        pbc=torch.ones(1, 3, dtype=torch.bool, device=device),
        velocities=v.to(device, torch.float32),
        forces=torch.zeros(n, 3, device=device),
        energy=torch.zeros(1, 1, device=device),
    )


def to_batch(systems: Systems, device: str) -> Batch:
    return Batch.from_data_list([_data(p, c, v, device) for p, c, v in systems.split()], device=device)


class _CellDataset:
    """W3's cells as nvalchemi ``(AtomicData, metadata)`` items, made on the device on demand."""

    def __init__(self, cells: ArgonCells, device: str) -> None:
        self.cells, self.device = cells, device

    def __len__(self) -> int:
        return len(self.cells)

    def __getitem__(self, index: int) -> tuple[AtomicData, dict[str, Any]]:
        pos, cell = self.cells.cell(index)
        return _data(pos, cell, None, self.device), {}

    def get_metadata(self, index: int) -> tuple[int, int]:
        return self.cells.num_atoms(index), 0


def _prime(dyn: Any, batch: Batch) -> None:
    """Forces for the first step, as ``FusedStage.run`` computes them."""
    dyn._call_hooks(DynamicsStage.BEFORE_COMPUTE, batch)
    dyn.compute(batch)


class NvMD(ObservedMD):
    """An nvalchemi batch, its neighbour-list hook and its integrators (see ``ObservedMD``)."""

    def __init__(self, batch: Batch, make: Any, nl: Any, sink: Any = None) -> None:
        super().__init__(make, _Observe)
        self.batch, self._nl = batch, nl
        self.num_atoms = batch.num_nodes
        self._sink = sink
        _prime(self._plain, batch)

    def run(self, n_steps: int, record: EnergyRecorder | None = None, every: int = 0) -> None:
        self.dynamics(record, every).run(self.batch, n_steps=n_steps)

    def nve(self) -> MDRun:
        model, nl = self._plain.model, self._nl
        return NvMD(self.batch, lambda hooks, seed: NVE(model, dt=spec.LANGEVIN.dt_fs, hooks=[nl, *hooks]), nl)

    def snapshots_written(self) -> int:
        if self._sink is None:
            return super().snapshots_written()
        return len(self._sink)


class NvAlchemi(Framework):
    """nvalchemi-toolkit with nvalchemi-toolkit-ops."""

    name = "nvalchemi"

    def __init__(self) -> None:
        self.version = metadata.version("nvalchemi-toolkit")
        self.notes = (
            "LennardJonesModelWrapper + NeighborListHook(skin=spec.SKIN, 0.5 unless --variant benchmarks.spec:SKIN=... sets it) at "
            "BEFORE_COMPUTE; NVTLangevin/NVE/FIRE via BaseDynamics.run; W3: FusedStage(sampler=SizeAwareSampler)"
        )
        if torch.cuda.is_available() and importlib.util.find_spec("triton") is None:
            # Its neighbour-list hook is torch.compile'd; without Triton inductor cannot build GPU
            # kernels, so let dynamo fall back to running the hook eagerly (and say so).
            import torch._dynamo as dynamo

            dynamo.config.suppress_errors = True
            self.notes += "; Triton missing: torch.compile falls back to eager"
        self._shared: dict[str, tuple[Any, Any]] = {}

    def _model(self, device: str) -> tuple[Any, Any]:
        if device not in self._shared:
            model = LennardJonesModelWrapper(epsilon=spec.EPSILON, sigma=spec.SIGMA, cutoff=spec.CUTOFF)
            nl = NeighborListHook(
                model.model_config.neighbor_config, skin=spec.SKIN, stage=DynamicsStage.BEFORE_COMPUTE
            )
            self._shared[device] = (model, nl)
        return self._shared[device]

    def md(self, systems: Systems, device: str, snapshots: Path | None = None, every: int = 0) -> MDRun:
        model, nl = self._model(device)
        batch = to_batch(systems, device)
        extra, sink = [], None
        if snapshots is not None:
            from nvalchemi.dynamics.hooks.logging import LoggingHook
            from nvalchemi.dynamics.hooks.snapshot import SnapshotHook
            from nvalchemi.dynamics.sinks import ZarrData

            sink = ZarrData(str(snapshots / "nvalchemi.zarr"))
            log = LoggingHook(backend="csv", frequency=every, log_path=str(snapshots / "nvalchemi_log.csv"))
            extra = [SnapshotHook(sink, frequency=every), log]
        p = spec.LANGEVIN

        def make(hooks: list[Any], seed: int) -> NVTLangevin:
            return NVTLangevin(
                model,
                dt=p.dt_fs,
                temperature=p.temperature,
                friction=p.friction_per_fs,
                random_seed=seed,
                hooks=[nl, *extra, *hooks],
            )

        return NvMD(batch, make, nl, sink)

    def relax(self, systems: Systems, device: str, max_steps: int, deadline: float | None) -> RelaxOutcome:
        model, nl = self._model(device)
        f = spec.FIRE
        batch = to_batch(systems, device)
        fire = FIRE(
            model,
            dt=f.dt_internal,
            dt_max=f.dt_max_internal,
            maxstep=f.maxstep,
            n_steps=max_steps,
            convergence_hook=ConvergenceHook.from_fmax(f.fmax),
            hooks=[nl, _Deadline(deadline)],
        )

        def go() -> None:
            _prime(fire, batch)
            fire.run(batch)

        seconds = timed(go, device)
        return RelaxOutcome(
            seconds=seconds, steps=fire.step_count, positions=batch.positions.detach().to("cpu", torch.float64)
        )

    def inflight(self, cells: ArgonCells, device: str, md_steps: int, deadline: float | None) -> InflightOutcome:
        model, nl = self._model(device)
        f, p = spec.FIRE, spec.LANGEVIN
        sampler = SizeAwareSampler(_CellDataset(cells, device), max_atoms=spec.W3_MAX_ATOMS)
        converged, tally = _ConvergedCount(), _IdTally()
        relax = FIRE(
            model,
            dt=f.dt_internal,
            dt_max=f.dt_max_internal,
            maxstep=f.maxstep,
            n_steps=spec.W3_RELAX_BUDGET,
            convergence_hook=ConvergenceHook.from_fmax(f.fmax),
            hooks=[converged],
        )
        md = NVTLangevin(
            model, dt=p.dt_fs, temperature=p.temperature, friction=p.friction_per_fs, random_seed=0, n_steps=md_steps
        )
        fused = FusedStage(
            sub_stages=[(0, relax), (1, md)],
            sampler=sampler,
            refill_frequency=REFILL_EVERY,
            sinks=[tally],
            hooks=[nl, _Deadline(deadline)],
        )
        seconds, completed = timed_until_deadline(fused.run, device)
        return InflightOutcome(seconds, tally.all_ids(), converged.count, completed)
