"""ASE on the CPU (W6): one ``Atoms`` per system with ASE's ``LennardJones`` calculator (the
others' truncated potential; ASE shifts each pair energy to zero at the cutoff, which moves
energies by a constant and leaves forces alone), ``ase.md.langevin.Langevin``
(the centre of mass held by ``FixCom``, as ASE recommends) and ``VelocityVerlet``, each system run in turn, as ASE users batch.

ASE's velocities are in Å per sqrt(amu Å²/eV) (10.18 fs), its time step in that unit.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from benchmarks import spec
from benchmarks.adapters.base import Framework, MDRun, Unavailable

try:
    from ase import units
    from ase.calculators.lj import LennardJones
    from ase.constraints import FixCom
    from ase.md.langevin import Langevin
    from ase.md.verlet import VelocityVerlet
except ImportError as exc:
    raise Unavailable(f"ase not importable ({exc}); pip install ase") from exc

if TYPE_CHECKING:
    from benchmarks.physics import EnergyRecorder
    from benchmarks.structures import Systems


class AseMD(MDRun):
    """One ASE dynamics object per system, stepped one system after another."""

    def __init__(self, atoms: list[Any], make: Any) -> None:
        self.atoms = atoms
        self.num_atoms = sum(len(a) for a in atoms)
        self._make = make
        self._dyns = [make(a, i) for i, a in enumerate(atoms)]

    def run(self, n_steps: int, record: EnergyRecorder | None = None, every: int = 0) -> None:
        samples: list[list[tuple[np.ndarray, float]]] = []
        for dyn, atoms in zip(self._dyns, self.atoms):
            mine: list[tuple[np.ndarray, float]] = []
            if record is None:
                dyn.run(n_steps)
            else:
                for done in range(0, n_steps, every):
                    dyn.run(min(every, n_steps - done))
                    mine.append((atoms.get_velocities(), atoms.get_potential_energy()))
            samples.append(mine)
        if record is None:
            return
        counts = torch.tensor([len(a) for a in self.atoms])
        index = torch.repeat_interleave(torch.arange(len(self.atoms)), counts)
        masses = torch.tensor(np.concatenate([a.get_masses() for a in self.atoms]))
        for k in range(len(samples[0])):
            v = torch.tensor(np.concatenate([s[k][0] for s in samples]))
            e = torch.tensor([s[k][1] for s in samples])
            record.observe(v, masses, index, len(self.atoms), e, velocity_unit_fs=spec.INTERNAL_TIME_FS)

    def nve(self) -> MDRun:
        return AseMD(self.atoms, lambda a, i: VelocityVerlet(a, timestep=spec.LANGEVIN.dt_fs * units.fs))


class Ase(Framework):
    """ASE's own Lennard-Jones and integrators (pure Python and numpy)."""

    name = "ase"
    devices = ("cpu",)

    def __init__(self) -> None:
        self.version = metadata.version("ase")
        self.notes = (
            "ase.calculators.lj.LennardJones(smooth=False) + ase.md.langevin.Langevin with FixCom, one Atoms per system"
        )

    def md(self, systems: Systems, device: str, snapshots: Path | None = None, every: int = 0) -> MDRun:
        self.check_device(device)
        if snapshots is not None:
            raise Unavailable("no snapshot adapter for ASE")
        atoms = systems.to_ase()
        for a in atoms:
            a.calc = LennardJones(sigma=spec.SIGMA, epsilon=spec.EPSILON, rc=spec.CUTOFF, smooth=False)
            a.set_constraint(FixCom())
        p = spec.LANGEVIN

        def make(a: Any, i: int) -> Langevin:
            return Langevin(
                a,
                timestep=p.dt_fs * units.fs,
                temperature_K=p.temperature,
                friction=p.friction_per_fs / units.fs,
                fixcm=False,
                rng=np.random.default_rng(i),
            )

        return AseMD(atoms, make)
