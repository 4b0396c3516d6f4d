"""What the workloads ask of a framework: one adapter per framework implements it.

An adapter drives a framework through its own public API (what its users call), on inputs the
harness built (:class:`~benchmarks.structures.Systems`), with the parameters of
:mod:`benchmarks.spec`. A framework that cannot be imported, or cannot do a workload, raises
:class:`Unavailable` with the reason, which the tables print instead of a figure.

Example:
    >>> from benchmarks.adapters.base import Unavailable
    >>> str(Unavailable("needs Python >= 3.12"))
    'needs Python >= 3.12'
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch

if TYPE_CHECKING:
    from benchmarks.physics import EnergyRecorder
    from benchmarks.structures import ArgonCells, Systems


class Unavailable(Exception):
    """The framework, or this workload in it, cannot run here; the message says why."""


@attrs.frozen
class RelaxOutcome:
    """One W2 relaxation: wall time of the framework's run call (device synchronised), steps
    taken, final positions, and what the framework counts of its own work (``engine``: for
    alchemi how often it captured its step; empty for peers)."""

    seconds: float
    steps: int
    positions: torch.Tensor  # [V, 3] host float64
    engine: dict[str, int] = attrs.field(factory=dict)


@attrs.frozen
class InflightOutcome:
    """One W3 drain: the ``system_id`` of every structure that came out, and how many left the
    relaxation converged (the others used its step budget); wall time of the drain, and whether
    it finished before its deadline (when not, the figures are what was done until then), and
    ``engine`` as in :class:`RelaxOutcome`."""

    seconds: float
    ids_out: np.ndarray
    converged: int
    completed: bool = True
    engine: dict[str, int] = attrs.field(factory=dict)


class IdTally:
    """What a framework's sink needs to keep only the ``system_id`` of graduated structures
    (nothing else leaves the device). Mix it in before the framework's ``DataSink`` and write
    ``write(batch, mask)`` to call :meth:`add`."""

    def __init__(self) -> None:
        self.ids: list[torch.Tensor] = []

    def add(self, system_id: torch.Tensor, mask: torch.Tensor | None) -> None:
        ids = system_id.reshape(-1)
        self.ids.append((ids if mask is None else ids[mask.reshape(-1)]).cpu())

    def read(self) -> Any:
        raise NotImplementedError("an IdTally keeps system ids only")

    def zero(self) -> None:
        self.ids = []

    def __len__(self) -> int:
        return 0  # never full

    @property
    def capacity(self) -> int:
        return 2**62

    def all_ids(self) -> np.ndarray:
        return torch.cat(self.ids).numpy() if self.ids else np.zeros(0, dtype=np.int64)


class MDRun(ABC):
    """A batch of systems under NVT Langevin (W1), ready to step."""

    #: Atoms in the batch.
    num_atoms: int

    @abstractmethod
    def run(self, n_steps: int, record: EnergyRecorder | None = None, every: int = 0) -> None:
        """Advance ``n_steps`` through the framework's run API; with ``record``, call
        ``record.observe(...)`` every ``every`` steps (untimed runs only)."""

    @abstractmethod
    def nve(self) -> MDRun:
        """The same batch, continued with velocity Verlet (NVE)."""

    def snapshots_written(self) -> int:
        """Records the snapshot sink holds (W5), read back from the store."""
        raise Unavailable("this run writes no snapshots")

    def close(self) -> None:  # noqa: B027 - optional: most runs hold nothing to release
        """Release files and device memory."""


class ObservedMD(MDRun):
    """An ``MDRun`` for frameworks whose hooks are fixed when the dynamics is made: one dynamics
    without observation and one per observation interval, each made by ``make(hooks, seed)``
    with its own random seed (their random streams continue across runs).

    Args:
        make: ``(extra_hooks, seed) -> dynamics``.
        observer: ``every -> hook`` whose ``target`` attribute receives the ``EnergyRecorder``.
    """

    #: Seed offset between the dynamics objects, so no two draw the same noise.
    SEED_STRIDE = 1_000_003

    def __init__(self, make: Any, observer: Any) -> None:
        self._make, self._observer = make, observer
        self._plain = make([], 0)
        self._observed: dict[int, tuple[Any, Any]] = {}

    def dynamics(self, record: EnergyRecorder | None, every: int) -> Any:
        """The dynamics to run: the plain one, or the one recording into ``record``."""
        if record is None:
            return self._plain
        if every not in self._observed:
            hook = self._observer(every)
            self._observed[every] = (self._make([hook], self.SEED_STRIDE * (1 + len(self._observed))), hook)
        dyn, hook = self._observed[every]
        hook.target = record
        return dyn


class Framework(ABC):
    """One framework under test."""

    #: Short name used in tables and JSON (``alchemi``, ``nvalchemi``, ``torchsim``, ``ase``).
    name: str = ""
    #: Its installed version.
    version: str = ""
    #: Devices it runs on.
    devices: tuple[str, ...] = ("cpu", "cuda")
    #: How it is driven, for the JSON (API, neighbour list, options chosen).
    notes: str = ""

    def check_device(self, device: str) -> None:
        if device not in self.devices:
            raise Unavailable(f"{self.name} does not run on {device} here")

    @abstractmethod
    def md(self, systems: Systems, device: str, snapshots: Path | None = None, every: int = 0) -> MDRun:
        """W1: NVT Langevin (``spec.LANGEVIN``) on ``systems``, starting from their velocities.
        With ``snapshots`` (a directory), every ``every`` steps every system is written to a
        store there (W5)."""

    def relax(self, systems: Systems, device: str, max_steps: int, deadline: float | None) -> RelaxOutcome:
        """W2: FIRE (``spec.FIRE``) until every system's largest force is at most
        ``spec.FIRE.fmax``, or ``max_steps``."""
        raise Unavailable(f"{self.name} has no FIRE adapter")

    def inflight(self, cells: ArgonCells, device: str, md_steps: int, deadline: float | None) -> InflightOutcome:
        """W3: every cell relaxed (FIRE to ``spec.FIRE.fmax``) and then ``md_steps`` NVT steps,
        fed through the framework's inflight batching."""
        raise Unavailable(f"{self.name} has no inflight batching")
