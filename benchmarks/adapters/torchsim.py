"""TorchSim (``torch-sim-atomistic``), driven as its documentation shows.

W1/W2/W5 call its integrator and optimiser step functions in a plain loop (``nvt_langevin_step``,
``nve_step``, ``fire_step``): the fastest way to use it, with no runner in between. The model is
its ``LennardJonesModel`` with its default neighbour list (``torchsim_nl``, rebuilt every step:
TorchSim has no Verlet skin). FIRE is its ``ase_fire`` flavour with ASE's parameters, as the
other frameworks run it. W3 uses its runners: ``ts.optimize`` with an ``InFlightAutoBatcher``,
then ``ts.integrate`` with a ``BinningAutoBatcher`` (TorchSim has no fused relax+MD stage), both
capped at the same atoms per batch as the other frameworks' samplers. Its units are eV, Å, amu
and sqrt(amu Å²/eV) (10.18 fs); timesteps given to its runners are in ps.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from benchmarks import spec
from benchmarks.adapters.base import Framework, InflightOutcome, MDRun, RelaxOutcome, Unavailable
from benchmarks.timing import check_deadline, timed, timed_until_deadline

try:
    import torch_sim as ts
    from torch_sim.autobatching import BinningAutoBatcher, InFlightAutoBatcher
    from torch_sim.integrators.nve import nve_step
    from torch_sim.integrators.nvt import nvt_langevin_init, nvt_langevin_step
    from torch_sim.models.lennard_jones import LennardJonesModel
    from torch_sim.optimizers.fire import fire_init, fire_step
    from torch_sim.runners import generate_force_convergence_fn
    from torch_sim.state import SimState
except SyntaxError as exc:  # its sources use Python 3.12 syntax
    raise Unavailable(
        f"torch-sim-atomistic needs Python >= 3.12 (here: {exc.msg} in {Path(exc.filename or '').name})"
    ) from exc
except Exception as exc:  # noqa: BLE001 - any import failure of a peer is a reason to report
    raise Unavailable(f"torch-sim-atomistic not importable: {type(exc).__name__}: {exc}") from exc

if TYPE_CHECKING:
    from benchmarks.physics import EnergyRecorder
    from benchmarks.structures import ArgonCells, Systems

#: Its runners take timesteps in ps and rates in 1/ps.
PS = 1000.0
SWAP_EVERY = 5


def _state(systems: Systems, device: str) -> SimState:
    """A batched ``SimState`` (float32), cells in TorchSim's column convention, each system's
    index kept as the system extra ``system_id``."""
    dev = torch.device(device)
    return SimState(
        positions=systems.positions.to(dev, torch.float32),
        masses=systems.masses.to(dev, torch.float32),
        cell=systems.cells.transpose(1, 2).contiguous().to(dev, torch.float32),
        pbc=True,
        atomic_numbers=systems.numbers.to(dev),
        system_idx=systems.system_index.to(dev),
        _system_extras={"system_id": torch.arange(systems.num_systems, device=dev, dtype=torch.float32)},
    )


class TsMD(MDRun):
    """A TorchSim ``MDState`` stepped by ``step(state)`` in a loop."""

    def __init__(self, state: Any, model: Any, step: Any, snapshots: Path | None = None, every: int = 0) -> None:
        self.state, self.model, self._step = state, model, step
        self.num_atoms = int(state.n_atoms)
        self._reporter = None
        self._count = 0
        self._every = every
        if snapshots is not None:
            from torch_sim.trajectory import TrajectoryReporter

            names = [str(snapshots / f"torchsim_{i}.h5") for i in range(state.n_systems)]
            self._reporter = TrajectoryReporter(names, state_frequency=every)
            self._names = names

    def run(self, n_steps: int, record: EnergyRecorder | None = None, every: int = 0) -> None:
        state, model, step = self.state, self.model, self._step
        for i in range(n_steps):
            state = step(state, model)
            if self._reporter is not None:
                self._reporter.report(state, self._count, model=model)
            self._count += 1
            if record is not None and i % every == 0:
                record.observe(
                    state.momenta / state.masses[:, None],
                    state.masses,
                    state.system_idx,
                    state.n_systems,
                    state.energy,
                    velocity_unit_fs=spec.INTERNAL_TIME_FS,
                )
        self.state = state

    def nve(self) -> MDRun:
        dt = spec.LANGEVIN.dt_fs / spec.INTERNAL_TIME_FS
        return TsMD(self.state, self.model, lambda s, m: nve_step(s, m, dt=dt))

    def snapshots_written(self) -> int:
        if self._reporter is None:
            return super().snapshots_written()
        from torch_sim.trajectory import TorchSimTrajectory

        self._reporter.finish()
        total = 0
        for name in self._names:
            with TorchSimTrajectory(name, mode="r") as traj:
                total += len(traj)
        return total


class TorchSim(Framework):
    """TorchSim 0.6 (``torch-sim-atomistic``)."""

    name = "torchsim"

    def __init__(self) -> None:
        self.version = metadata.version("torch-sim-atomistic")
        self.notes = (
            "LennardJonesModel (default torchsim_nl, rebuilt every step); nvt_langevin_step/nve_step/"
            "fire_step(ase_fire) in a loop; W3: ts.optimize(InFlightAutoBatcher) then "
            "ts.integrate(BinningAutoBatcher)"
        )

    def _model(self, device: str) -> LennardJonesModel:
        return LennardJonesModel(
            sigma=spec.SIGMA, epsilon=spec.EPSILON, cutoff=spec.CUTOFF, device=torch.device(device), dtype=torch.float32
        )

    def md(self, systems: Systems, device: str, snapshots: Path | None = None, every: int = 0) -> MDRun:
        model = self._model(device)
        p = spec.LANGEVIN
        state = _state(systems, device)
        state.rng = 0
        md = nvt_langevin_init(state, model, kT=p.kT)
        if systems.velocities is not None:
            v = systems.velocities.to(md.momenta) * spec.INTERNAL_TIME_FS
            md.momenta = v * md.masses[:, None]
        dt = p.dt_fs / spec.INTERNAL_TIME_FS
        gamma = p.friction_per_fs * spec.INTERNAL_TIME_FS
        return TsMD(md, model, lambda s, m: nvt_langevin_step(s, m, dt=dt, kT=p.kT, gamma=gamma), snapshots, every)

    def relax(self, systems: Systems, device: str, max_steps: int, deadline: float | None) -> RelaxOutcome:
        model = self._model(device)
        f = spec.FIRE
        state = _state(systems, device)
        steps = 0
        result: list[Any] = []

        def go() -> None:
            nonlocal steps
            st = fire_init(state, model, dt_start=f.dt_ase, fire_flavor="ase_fire")
            while steps < max_steps:
                st = fire_step(st, model, dt_max=f.dt_max_ase, max_step=f.maxstep, fire_flavor="ase_fire")
                steps += 1
                if bool((ts.system_wise_max_force(st) <= f.fmax).all()):
                    break
                check_deadline(deadline)
            result.append(st)

        seconds = timed(go, device)
        return RelaxOutcome(
            seconds=seconds, steps=steps, positions=result[0].positions.detach().to("cpu", torch.float64)
        )

    def inflight(self, cells: ArgonCells, device: str, md_steps: int, deadline: float | None) -> InflightOutcome:
        model = self._model(device)
        f, p = spec.FIRE, spec.LANGEVIN
        state = _state(cells.systems(), device)
        converged_fn = generate_force_convergence_fn(force_tol=f.fmax)

        def converged_or_stop(st: Any, last_energy: Any) -> torch.Tensor:
            check_deadline(deadline)
            return converged_fn(st, last_energy)

        def langevin_step(state: Any, model: Any, **kwargs: Any) -> Any:
            check_deadline(deadline)
            return nvt_langevin_step(state, model, **kwargs)

        out: list[Any] = []

        def go() -> None:
            relaxed = ts.optimize(
                state,
                model,
                optimizer=ts.Optimizer.fire,
                convergence_fn=converged_or_stop,
                max_steps=spec.W3_RELAX_BUDGET,
                steps_between_swaps=SWAP_EVERY,
                autobatcher=InFlightAutoBatcher(
                    model, memory_scales_with="n_atoms", max_memory_scaler=spec.W3_MAX_ATOMS
                ),
                init_kwargs={"dt_start": f.dt_ase, "fire_flavor": "ase_fire"},
                dt_max=f.dt_max_ase,
                max_step=f.maxstep,
                fire_flavor="ase_fire",
            )
            out.append(int((ts.system_wise_max_force(relaxed) <= f.fmax).sum()))
            final = ts.integrate(
                relaxed,
                model,
                integrator=(nvt_langevin_init, langevin_step),
                n_steps=md_steps,
                temperature=p.temperature,
                timestep=p.dt_fs / PS,
                autobatcher=BinningAutoBatcher(
                    model, memory_scales_with="n_atoms", max_memory_scaler=spec.W3_MAX_ATOMS
                ),
                gamma=p.friction_per_fs * spec.INTERNAL_TIME_FS,  # a custom integrator's kwargs are not converted
            )
            out.append(final)

        seconds, completed = timed_until_deadline(go, device)
        if not completed:  # its two phases give no structure out before the last MD batch ends
            return InflightOutcome(seconds, np.zeros(0, dtype=np.int64), out[0] if out else 0, False)
        ids = out[1].system_extras["system_id"].round().long().cpu().numpy()
        return InflightOutcome(seconds, ids, out[0])
