"""The correctness checks that go with every speed figure, computed the same way for every
framework from its own tensors.

* Temperature: each system's kinetic energy without its centre-of-mass motion, over ``3N - 3``
  degrees of freedom, which is right whether a thermostat keeps the COM at rest (alchemi, ASE)
  or lets it move (nvalchemi, TorchSim). The mean over systems and samples after equilibration
  must lie within 2 % of the target; the standard error comes from block averages.
* NVE drift: total energy per atom against time, least-squares slope (meV/atom/ps) and largest
  excursion from the start (meV/atom).
* Relaxation: the largest atomic force of every structure, evaluated independently of the
  framework that relaxed it, at or below the threshold.
* Accounting: structures out = structures in, each once.

Example:
    >>> import torch
    >>> rec = EnergyRecorder()
    >>> v = torch.tensor([[1e-3, 0.0, 0.0], [-1e-3, 0.0, 0.0]])
    >>> rec.observe(v, torch.full((2,), 39.948), torch.zeros(2, dtype=torch.long), 1, torch.zeros(1))
    >>> temperature_check(rec.result()["ke_internal"], torch.tensor([2]), target=50.0)["samples"]
    1
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from alchemi_core.units import AMU_A2_PER_FS2_TO_EV
from benchmarks import spec

#: Relative tolerance of the temperature check (BENCHMARKS.md).
TEMPERATURE_TOLERANCE = 0.02
#: Atoms per slice of :meth:`EnergyRecorder.observe` (bounds its temporaries).
OBSERVE_SLICE = 1 << 16


class EnergyRecorder:
    """Collects per-system kinetic (internal and total) and potential energies during a run.

    Adapters call :meth:`observe` from inside the run (a hook, or their step loop) with device
    tensors; the sums stay on the device until :meth:`result`, so observing never waits for it.
    """

    def __init__(self) -> None:
        self._rows: list[torch.Tensor] = []

    def observe(
        self,
        velocities: torch.Tensor,
        masses: torch.Tensor,
        system_index: torch.Tensor,
        num_systems: int,
        potential: torch.Tensor,
        velocity_unit_fs: float = 1.0,
    ) -> None:
        """Record one sample.

        Args:
            velocities: ``[V, 3]`` in Å per ``velocity_unit_fs`` fs.
            masses: ``[V]`` amu.
            system_index: ``[V]`` system of each atom.
            num_systems: B.
            potential: ``[B]`` or ``[B, 1]`` potential energy, eV.
            velocity_unit_fs: The time unit of ``velocities`` in fs (1 for Å/fs; 10.18 for the
                internal unit of nvalchemi and TorchSim).
        """
        vel = velocities.detach().reshape(-1, 3)
        mas = masses.detach().reshape(-1)
        sys_of = system_index.reshape(-1)
        dev = vel.device
        ke = torch.zeros(num_systems, dtype=torch.float64, device=dev)
        momentum = torch.zeros(num_systems, 3, dtype=torch.float64, device=dev)
        mass = torch.zeros(num_systems, dtype=torch.float64, device=dev)
        # Slices of atoms, so the instrument's float64 temporaries stay a few MB instead of
        # ~100 B per atom on top of the framework it measures (peaks are part of the report).
        for a in range(0, vel.shape[0], OBSERVE_SLICE):
            v = vel[a : a + OBSERVE_SLICE].to(torch.float64) / velocity_unit_fs
            m = mas[a : a + OBSERVE_SLICE].to(torch.float64)
            idx = sys_of[a : a + OBSERVE_SLICE].long()
            ke.index_add_(0, idx, 0.5 * m * (v * v).sum(-1))
            momentum.index_add_(0, idx, v * m[:, None])
            mass.index_add_(0, idx, m)
        ke_com = 0.5 * (momentum * momentum).sum(-1) / mass
        pot = potential.detach().reshape(-1).to(torch.float64)
        self._rows.append(torch.stack([(ke - ke_com) * AMU_A2_PER_FS2_TO_EV, ke * AMU_A2_PER_FS2_TO_EV, pot]))

    def result(self) -> dict[str, torch.Tensor]:
        """``ke_internal``, ``ke_total``, ``potential``: ``[samples, B]`` host float64 (eV)."""
        if not self._rows:
            empty = torch.zeros(0, 0, dtype=torch.float64)
            return {"ke_internal": empty, "ke_total": empty, "potential": empty}
        rows = torch.stack(self._rows).cpu()
        return {"ke_internal": rows[:, 0], "ke_total": rows[:, 1], "potential": rows[:, 2]}


def _block_stderr(series: np.ndarray, blocks: int = 10) -> float:
    """Standard error of the mean of a correlated series from (at most) ``blocks`` block
    averages; NaN for fewer than two samples."""
    blocks = min(blocks, len(series))
    if blocks < 2:
        return float("nan")
    n = len(series) // blocks
    means = series[: n * blocks].reshape(blocks, n).mean(axis=1)
    return float(means.std(ddof=1) / np.sqrt(blocks))


def temperature_check(
    ke_internal: torch.Tensor, atoms_per_system: torch.Tensor, target: float, tolerance: float = TEMPERATURE_TOLERANCE
) -> dict[str, Any]:
    """Mean temperature of ``[samples, B]`` internal kinetic energies against ``target`` K.

    Returns:
        ``mean_K``, ``stderr_K``, ``deviation`` (relative), ``samples``, ``passed`` (within the
        tolerance) and ``verdict``: ``"pass"``, ``"FAIL"``, or ``"inconclusive"`` when the mean
        misses the tolerance by less than three standard errors (too few samples to tell; a
        framework that had to shrink its run for its time cap).
    """
    if ke_internal.numel() == 0:
        return {
            "mean_K": None,
            "stderr_K": None,
            "deviation": None,
            "samples": 0,
            "passed": False,
            "verdict": "inconclusive",
        }
    dof = (3 * atoms_per_system.to(torch.float64) - 3).clamp(min=1.0)
    temps = 2.0 * ke_internal / (dof * spec.BOLTZMANN)  # [samples, B]
    series = temps.mean(dim=1).numpy()
    mean = float(series.mean())
    stderr = _block_stderr(series)
    deviation = mean / target - 1.0
    passed = abs(deviation) <= tolerance
    if passed:
        verdict = "pass"
    elif np.isfinite(stderr) and abs(mean - target) <= tolerance * target + 3.0 * stderr:
        verdict = "inconclusive"
    else:
        verdict = "FAIL"
    return {
        "mean_K": mean,
        "stderr_K": stderr,
        "deviation": deviation,
        "samples": int(temps.shape[0]),
        "passed": passed,
        "verdict": verdict,
    }


def nve_drift(ke_total: torch.Tensor, potential: torch.Tensor, atoms: int, interval_fs: float) -> dict[str, Any]:
    """Drift of the total energy of ``[samples, B]`` records taken every ``interval_fs``.

    Returns:
        ``slope_meV_per_atom_ps`` (least squares over all systems' mean) and
        ``max_excursion_meV_per_atom`` (largest ``|E(t) - E(0)|`` of any system).
    """
    if ke_total.shape[0] < 2:
        return {"slope_meV_per_atom_ps": None, "max_excursion_meV_per_atom": None, "samples": int(ke_total.shape[0])}
    total = (ke_total + potential).numpy()  # [samples, B]
    per_atom = total.sum(axis=1) / atoms
    t_ps = np.arange(len(per_atom)) * interval_fs / 1000.0
    slope = float(np.polyfit(t_ps, per_atom, 1)[0]) * 1e3
    counts = atoms / total.shape[1]
    excursion = float(np.abs(total - total[0]).max() / counts) * 1e3
    return {"slope_meV_per_atom_ps": slope, "max_excursion_meV_per_atom": excursion, "samples": int(total.shape[0])}


def force_check(fmax: torch.Tensor, threshold: float, rtol: float = 1e-3) -> dict[str, Any]:
    """Every structure's largest force at or below ``threshold`` (eV/Å), up to float32 rounding
    (``rtol``): the framework converged in its own precision, the check recomputes in float64."""
    fmax = fmax.detach().cpu().to(torch.float64)
    over = int((fmax > threshold * (1.0 + rtol)).sum())
    return {"max_fmax": float(fmax.max()) if fmax.numel() else None, "above_threshold": over, "passed": over == 0}


def count_check(ids_in: int, ids_out: torch.Tensor | np.ndarray) -> dict[str, Any]:
    """Structures out = structures in, each ``system_id`` once."""
    ids = np.asarray(ids_out).reshape(-1)
    distinct = int(len(np.unique(ids)))
    return {
        "in": int(ids_in),
        "out": int(len(ids)),
        "distinct": distinct,
        "passed": len(ids) == ids_in and distinct == ids_in,
    }
