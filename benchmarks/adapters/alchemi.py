"""alchemi, driven as its users drive it: ``model:lennard-jones`` with a fixed neighbour-matrix
width, ``integrator:langevin`` / ``velocity-verlet`` / ``fire``, ``BaseDynamics.run`` and a
``FusedStage`` fed by a ``SizeAwareSampler``; on a GPU every stage is ``compile()``-d and run
inside ``with stage:``, which captures the step as a CUDA graph.

Example:
    >>> from benchmarks.adapters.alchemi import Alchemi
    >>> Alchemi().name
    'alchemi'
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from benchmarks import spec
from benchmarks.adapters.base import (
    Framework,
    InflightOutcome,
    MDRun,
    ObservedMD,
    RelaxOutcome,
    Unavailable,
)
from benchmarks.timing import check_deadline, timed, timed_until_deadline

try:
    from alchemi_core.data import Batch
    from alchemi_core.dynamics import (
        ConvergenceHook,
        DynamicsStage,
        FusedStage,
        Hook,
        SizeAwareSampler,
    )
    from alchemi_integrators import FIRE, Langevin, VelocityVerlet
    from alchemi_potentials import BatchedNeighborList, LennardJones
    from benchmarks.alchemi_parts import CellDataset, ConvergedCount, IdTallySink
except ImportError as exc:  # pragma: no cover - the harness ships with alchemi
    raise Unavailable(
        f"alchemi plugins missing ({exc}); pip install -e plugins/alchemi-potentials -e plugins/alchemi-integrators"
    ) from exc

if TYPE_CHECKING:
    from benchmarks.physics import EnergyRecorder
    from benchmarks.structures import ArgonCells, Systems

#: Steps between convergence / refill checks (the only device read-backs) in W2 and W3. W3's
#: checks cost host time while the GPU waits (a read-back, then the refill's loading of new
#: structures); on the H200 W3 drained in 7.55 s with checks every 5 steps and 6.13 s every 10
#: (``python -m tools.phases w3 --check-every 5,10``, one process, timers synchronised).
CHECK_EVERY_RELAX = 1
CHECK_EVERY_INFLIGHT = 10
#: W3 hands on finished systems and refills their slots at every this many checks. Each refill
#: changes the set of systems (a new layout, a recapture); cells that converged a check apart
#: leave a check apart, so with a refill at every check the refills multiply over a long run
#: (a replay of W3's checks on a CPU: 3.8 / 4.5 / 6.7 changes per 1,000 cells at 10k / 30k /
#: 100k cells; 1.3 at every 5 checks). On an H100 (``--variant``), at every 1 / 3 / 5 checks:
#: 10,000 cells 4.19 and 4.38 / 4.13 / 4.17 and 4.13 s; 100,000 cells 47.1 / - / 37.6 s.
REFILL_EVERY_CHECKS = 5
#: Steps between deadline checks (a host clock read).
DEADLINE_EVERY = 10


def _workers() -> dict[str, int]:
    """``workers=`` for W3's sampler, where the installed alchemi has it (see spec)."""
    import inspect

    takes = "workers" in inspect.signature(SizeAwareSampler).parameters
    return {"workers": spec.W3_SAMPLER_WORKERS} if takes and spec.W3_SAMPLER_WORKERS else {}


class _Observe(Hook):
    """Hands the batch's velocities and energies to an ``EnergyRecorder`` every N steps."""

    stage = DynamicsStage.AFTER_STEP

    def __init__(self, every: int) -> None:
        super().__init__(frequency=every)
        self.target: EnergyRecorder | None = None

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        if self.target is not None:
            self.target.observe(batch.velocities, batch.atomic_masses, batch.batch_idx, batch.num_graphs, batch.energy)


class _Deadline(Hook):
    """Stops a run that passes its time cap (a host clock read every N steps)."""

    stage = DynamicsStage.AFTER_STEP

    def __init__(self, deadline: float | None) -> None:
        super().__init__(frequency=DEADLINE_EVERY)
        self.deadline = deadline

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        check_deadline(self.deadline)


def _engine_counts(run: Any) -> dict[str, int]:
    """How often the run just done captured its step: each capture costs an eager step and a
    recording of host time that the GPU waits for."""
    state = getattr(run._engine, "state", run._engine)  # a checkout before the RunState kept it on the engine
    return {"graph_captures": int(state.graph_captures)}


def to_batch(systems: Systems, device: str, dtype: torch.dtype = torch.float32) -> Batch:
    """An alchemi batch of ``systems`` (float32 positions, velocities when given)."""
    b = systems.num_systems
    fields = {
        "positions": systems.positions.to(dtype),
        "atomic_numbers": systems.numbers,
        "atomic_masses": systems.masses.to(dtype),
        "cell": systems.cells.to(dtype),
        "pbc": torch.ones(b, 3, dtype=torch.bool),
        "system_id": torch.arange(b, dtype=torch.long),
    }
    levels = {
        "positions": "node",
        "atomic_numbers": "node",
        "atomic_masses": "node",
        "cell": "system",
        "pbc": "system",
        "system_id": "system",
    }
    if systems.velocities is not None:
        fields["velocities"] = systems.velocities.to(dtype)
        levels["velocities"] = "node"
    fields = {k: v.to(device) for k, v in fields.items()}
    return Batch.from_segments(fields, levels, num_nodes=systems.counts.numpy(), device=device)


class AlchemiMD(ObservedMD):
    """An alchemi batch and its integrators (see ``ObservedMD``)."""

    def __init__(self, batch: Batch, make: Any, sink: Any = None, store: Path | None = None) -> None:
        super().__init__(make, _Observe)
        self.batch = batch
        self.num_atoms = batch.num_nodes
        self._sink, self._store = sink, store

    def run(self, n_steps: int, record: EnergyRecorder | None = None, every: int = 0) -> None:
        dyn = self.dynamics(record, every)
        with dyn:
            dyn.run(self.batch, n_steps=n_steps)
        if self._sink is not None:
            # Snapshots written in the background count against this run, not the next one.
            self._sink.flush()

    def nve(self) -> MDRun:
        model = self._plain.model
        tuned = {"tuning": self._plain.tuning} if getattr(self._plain, "tuning", None) is not None else {}
        return AlchemiMD(
            self.batch,
            lambda hooks, seed: VelocityVerlet(model, dt=spec.LANGEVIN.dt_fs, hooks=hooks, **tuned).compile(),
        )

    def snapshots_written(self) -> int:
        from alchemi_zarr import AtomicDataZarrReader

        if self._sink is None:
            return super().snapshots_written()
        self._sink.close()
        return len(AtomicDataZarrReader(str(self._store)))

    def close(self) -> None:
        if self._sink is not None:
            self._sink.close()


class Alchemi(Framework):
    """alchemi (this repository): core, alchemi-potentials, alchemi-integrators."""

    name = "alchemi"

    def __init__(self, tuning: str = "") -> None:
        #: ``--tuning``'s settings (``benchmarks.tunings``): empty, the components' own defaults (and
        #: no ``tuning=`` passed, so an alchemi from before tunings, a comparison's base, runs too).
        self.tuning = tuning
        self.version = metadata.version("alchemi-core")
        self.notes = (
            "LennardJones(alchemi's skin for the device, PotentialsTuning.skin; max_neighbors fixed at "
            "spec.COLUMNS_HEADROOM x the expected count) + Langevin/FIRE; BaseDynamics.run and "
            "FusedStage + SizeAwareSampler (W3: its cells built by 4 worker processes, refills at every "
            "REFILL_EVERY_CHECKS-th check); compile() + `with stage:` (CUDA graph on GPUs)"
        )

    def tuned(self, part: str, device: str) -> dict[str, Any]:
        """``{"tuning": ...}``: the ``part`` (``"core"``, ``"potentials"``, ``"zarr"``) of
        ``--tuning``'s choices for ``device``, to pass to a component; empty without ``--tuning``."""
        if not self.tuning:
            return {}
        from benchmarks.tunings import Tunings

        return {"tuning": getattr(Tunings.parse(torch.device(device).type, self.tuning), part)}

    def model(self, device: str = "cuda") -> LennardJones:
        """W1's Lennard-Jones at alchemi's own skin for ``device`` (what a user gets without
        choosing one: ``PotentialsTuning.skin``), with columns fixed for it (no read-back, for graphs)."""
        tuned = self.tuned("potentials", device)
        skin_on = getattr(BatchedNeighborList(spec.CUTOFF, spec.SKIN), "skin_on", None)
        # An alchemi from before skins by device (a comparison's base) had 0.5 Å everywhere.
        skin = spec.SKIN if skin_on is None else BatchedNeighborList(spec.CUTOFF, **tuned).skin_on(
            torch.device(device).type)
        return LennardJones(
            spec.EPSILON,
            spec.SIGMA,
            spec.CUTOFF,
            skin=skin,
            max_neighbors=spec.neighbor_columns(spec.CUTOFF + skin),
            **tuned,
        )

    def md(self, systems: Systems, device: str, snapshots: Path | None = None, every: int = 0) -> MDRun:
        model = self.model(device)
        batch = to_batch(systems, device)
        hooks, sink, path = [], None, None
        if snapshots is not None:
            try:
                from alchemi_hooks.logger import LoggingHook
                from alchemi_hooks.snapshot import SnapshotHook
                from alchemi_zarr import ZarrData
            except ImportError as exc:
                raise Unavailable(f"W5 needs alchemi-hooks and alchemi-zarr ({exc})") from exc
            path = snapshots / "alchemi.zarr"
            sink = ZarrData(str(path), asynchronous=True, **self.tuned("zarr", device))
            log = LoggingHook(backend="csv", log_path=snapshots / "alchemi_log.csv", frequency=every)
            hooks = [SnapshotHook(sink, frequency=every), log]
        p = spec.LANGEVIN

        def make(extra: list[Any], seed: int) -> Langevin:
            return Langevin(
                model,
                dt=p.dt_fs,
                temperature=p.temperature,
                friction=p.friction_per_fs,
                random_seed=seed,
                hooks=[*hooks, *extra],
                **self.tuned("core", device),
            ).compile()

        return AlchemiMD(batch, make, sink, path)

    def relax(self, systems: Systems, device: str, max_steps: int, deadline: float | None) -> RelaxOutcome:

        f = spec.FIRE
        batch = to_batch(systems, device)
        fire = FIRE(
            self.model(device),
            n_steps=max_steps,
            dt=f.dt_fs,
            dt_max=f.dt_max_fs,
            maxstep=f.maxstep,
            maxstep_scope="system",
            hooks=[_Deadline(deadline)],
            convergence_hook=ConvergenceHook.from_fmax(f.fmax, frequency=CHECK_EVERY_RELAX),
            **self.tuned("core", device),
        ).compile()

        def go() -> None:
            with fire:
                fire.run(batch)

        seconds = timed(go, device)
        return RelaxOutcome(
            seconds=seconds,
            steps=fire.step_count,
            positions=batch.positions.detach().to("cpu", torch.float64),
            engine=_engine_counts(fire),
        )

    def inflight(
        self,
        cells: ArgonCells,
        device: str,
        md_steps: int,
        deadline: float | None,
        compile_step: bool = True,
        check_every: int = CHECK_EVERY_INFLIGHT,
    ) -> InflightOutcome:
        """W3's fused relax-then-MD stage; ``compile_step=False`` steps eagerly and ``check_every``
        sets the steps between checks (diagnoses: ``tools.phases w3``)."""
        f, p = spec.FIRE, spec.LANGEVIN
        model = self.model(device)
        sampler = SizeAwareSampler(CellDataset(cells), max_atoms=spec.W3_MAX_ATOMS, bin_width=32, **_workers())
        converged, tally = ConvergedCount(), IdTallySink()
        relax = FIRE(
            model,
            n_steps=spec.W3_RELAX_BUDGET,
            dt=f.dt_fs,
            dt_max=f.dt_max_fs,
            maxstep=f.maxstep,
            maxstep_scope="system",
            sampler=sampler,
            refill_frequency=check_every * REFILL_EVERY_CHECKS,
            hooks=[converged],
            convergence_hook=ConvergenceHook.from_fmax(f.fmax, frequency=check_every),
        )
        md = Langevin(
            model,
            n_steps=md_steps,
            dt=p.dt_fs,
            temperature=p.temperature,
            friction=p.friction_per_fs,
            random_seed=0,
            sinks=[tally],
            refill_frequency=check_every * REFILL_EVERY_CHECKS,
        )
        fused = FusedStage([(0, relax), (1, md)], hooks=[_Deadline(deadline)], **self.tuned("core", device))
        if compile_step:
            fused.compile()

        def go() -> None:
            with fused:
                fused.run(sampler.build_initial_batch(device))

        seconds, completed = timed_until_deadline(go, device)
        return InflightOutcome(seconds, tally.all_ids(), converged.count, completed, _engine_counts(fused))
