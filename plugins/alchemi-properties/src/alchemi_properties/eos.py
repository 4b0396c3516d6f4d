"""Equations of state of many structures in one call: ``equation_of_state``.

Each structure's cell is scaled (positions with it) to ``n_volumes`` volumes evenly spaced from
``1 - volume_range`` to ``1 + volume_range`` times its own; every scaled cell of every structure
has its positions relaxed at fixed cell (FIRE, batched inflight by the engine; or is only
evaluated, ``relax_positions=False``), and the energies of each structure are fitted with ASE's
:class:`ase.eos.EquationOfState` (Birch-Murnaghan by default). The structures should be relaxed
(cell included) first, so that the minimum lies inside the volumes sampled.

Units: volumes in Å³ (the whole cell), energies in eV, B0 in eV/Å³ (``b0_gpa`` in GPa), B0'
dimensionless.

Example:
    >>> from ase.build import bulk
    >>> from alchemi_core import registry
    >>> from alchemi_properties import equation_of_state
    >>> lj = registry.build("model:lennard-jones", epsilon=0.4093, sigma=2.338, cutoff=5.5, shift_energy=True)
    >>> [cu] = equation_of_state([bulk("Cu", "fcc", a=3.6)], lj, relax_positions=False)
    >>> cu.error is None and 9 < cu.v0 < 13 and 200 < cu.b0_gpa < 500
    True
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch

from alchemi_core.errors import ConfigurationError
from alchemi_core.units import EV_PER_A3_TO_GPA
from alchemi_properties.derived import run_per_structure

if TYPE_CHECKING:
    import ase

    from alchemi_core.data import AtomicData, Batch

#: ASE's equations of state whose fit has a pressure derivative of B (parameters E0, B0, B0', V0).
WITH_B0_PRIME = ("murnaghan", "birch", "birchmurnaghan", "pouriertarantola", "vinet")


@attrs.frozen
class EOSResult:
    """The equation of state of one structure.

    Attributes:
        structure: Its index in the input.
        volumes: The volumes sampled (Å³, the whole cell), one per derived structure.
        energies: The energy at each (eV); NaN where that derived structure failed.
        eos: The equation of state fitted (a name of ``ase.eos.eos_names``).
        v0: Equilibrium volume (Å³); None when the structure failed.
        e0: Energy at ``v0`` (eV).
        b0: Bulk modulus at ``v0`` (eV/Å³).
        b0_prime: Its pressure derivative (None for fits without one: ``sj``, ``taylor``, ``p3``,
            ``anton-schmidt``).
        error: Why there is no fit (a derived structure that failed, a fit that did not converge,
            a minimum outside the volumes sampled), or None.
    """

    structure: int
    volumes: tuple[float, ...]
    energies: tuple[float, ...]
    eos: str
    v0: float | None = None
    e0: float | None = None
    b0: float | None = None
    b0_prime: float | None = None
    error: str | None = None

    @property
    def b0_gpa(self) -> float | None:
        """``b0`` in GPa."""
        return None if self.b0 is None else self.b0 * EV_PER_A3_TO_GPA


def equation_of_state(
    structures: Sequence[ase.Atoms | AtomicData] | Batch,
    model: Any,
    *,
    n_volumes: int = 9,
    volume_range: float = 0.1,
    eos: str = "birchmurnaghan",
    relax_positions: bool = True,
    fmax: float = 0.01,
    max_steps: int = 500,
    dtype: torch.dtype | None = torch.float64,
    device: str | torch.device | None = None,
    max_atoms: int | None = None,
    max_batch_size: int | None = None,
    progress: bool = False,
) -> list[EOSResult]:
    """Fit an equation of state to each structure (see the module docstring).

    Args:
        structures: ASE ``Atoms``, ``AtomicData`` or a ``Batch``, periodic in 3 dimensions.
        model: An alchemi model (``registry.build("model:...")``), on the device to run on.
        n_volumes: Volumes per structure (at least 5).
        volume_range: The volumes span ``(1 - volume_range, 1 + volume_range)`` times each
            structure's own (0 < volume_range < 1).
        eos: An equation of state ASE fits (``ase.eos.eos_names``).
        relax_positions: Relax the positions at each volume (FIRE at fixed cell), else only
            evaluate the scaled structures.
        fmax: Force threshold of that relaxation (eV/Å).
        max_steps: Most FIRE steps per scaled structure; one that does not converge fails its
            structure.
        dtype: Floating dtype of positions and results (float64: fits amplify round-off).
        device: Where to run (default: where the model's parameters are).
        max_atoms: Most atoms per batch (None: planned from the device's memory and the model).
        max_batch_size: Most structures per batch.
        progress: Show a progress bar.

    Returns:
        One :class:`EOSResult` per structure, in input order; a structure that fails has
        ``error`` set and is never dropped.

    Raises:
        ConfigurationError: No structures, an unknown ``eos``, or sampling that cannot be fitted.
    """
    from ase.eos import eos_names

    if eos not in eos_names:
        raise ConfigurationError(f"equation_of_state: unknown eos {eos!r}; ASE fits {eos_names}")
    if n_volumes < 5:
        raise ConfigurationError(f"equation_of_state: n_volumes must be at least 5 (a 4-parameter fit), got {n_volumes}")
    if not 0 < volume_range < 1:
        raise ConfigurationError(f"equation_of_state: volume_range must lie in (0, 1), got {volume_range}")
    factors = np.linspace(1 - volume_range, 1 + volume_range, n_volumes)

    def scaled_cells(atoms: ase.Atoms) -> list[ase.Atoms]:
        out = []
        for f in factors:
            scaled = atoms.copy()
            scaled.set_cell(atoms.cell * f ** (1 / 3), scale_atoms=True)
            out.append(scaled)
        return out

    per_structure = run_per_structure(
        structures, scaled_cells, model, relax_positions=relax_positions, compute_stress=False, fmax=fmax,
        max_steps=max_steps, dtype=dtype, device=device, max_atoms=max_atoms, max_batch_size=max_batch_size,
        progress=progress,
    )
    out = []
    for i, (atoms, results) in enumerate(per_structure):
        volumes = tuple(float(abs(atoms.cell.volume) * f) for f in factors)
        if isinstance(results, str):
            out.append(EOSResult(i, volumes, (float("nan"),) * n_volumes, eos, error=results))
        else:
            out.append(_fit(i, volumes, results, eos))
    return out


def _fit(structure: int, volumes: tuple[float, ...], results: list[ase.Atoms], eos: str) -> EOSResult:
    """Fit the energies of one structure's scaled cells, or say why not."""
    from ase.eos import EquationOfState

    energies = tuple(float("nan") if "failure" in a.info else float(a.get_potential_energy()) for a in results)
    failed = [f"volume {a.info['derived']}: {a.info['failure']}" for a in results if "failure" in a.info]
    if failed:
        return EOSResult(structure, volumes, energies, eos, error="; ".join(failed))
    fit = EquationOfState(list(volumes), list(energies), eos=eos)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # curve_fit's covariance warnings: the checks below decide
            v0, e0, b0 = (float(x) for x in fit.fit(warn=False))
    except (RuntimeError, ValueError, np.linalg.LinAlgError) as exc:
        return EOSResult(structure, volumes, energies, eos, error=f"the {eos} fit failed: {exc}")
    if not min(volumes) < v0 < max(volumes) or not np.isfinite([v0, e0, b0]).all():
        return EOSResult(structure, volumes, energies, eos, v0, e0, b0,
                         error=f"the minimum ({v0:.4g} Å³) lies outside the volumes sampled "
                               f"({min(volumes):.4g} to {max(volumes):.4g} Å³): relax the cell first or widen volume_range")
    b0_prime = float(fit.eos_parameters[2]) if eos in WITH_B0_PRIME else None
    return EOSResult(structure, volumes, energies, eos, v0, e0, b0, b0_prime)
