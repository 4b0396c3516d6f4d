"""Elastic tensors of many structures in one call: ``elastic_tensor``.

The standard finite-difference method: each structure's cell is strained by ``-strain`` and
``+strain`` on each of the six Voigt components (``xx, yy, zz, yz, xz, xy``; shear components as
engineering strains), the positions of every strained cell of every structure are relaxed at fixed
cell (FIRE, batched inflight by the engine; ``relax_positions=False`` keeps them clamped), the
model gives each one's stress, and column ``j`` of the 6x6 tensor is the central difference
``(stress(+strain_j) - stress(-strain_j)) / (2 strain)``. Stress is positive under tension, so a
stable crystal has a positive definite tensor. The tensor is in the Cartesian frame of the cell
as given; the structures should be relaxed (cell included) first, or the tensor includes the
effect of the residual stress.

From the tensor: the Voigt, Reuss and Hill (their mean) bulk and shear moduli
(:func:`voigt_reuss_hill`). A tensor that is not symmetric (beyond ``symmetry_tolerance`` of its
largest element) or not positive definite gives a warning, kept in the result's ``warnings``.

Units: the tensor and the moduli in GPa.

Example:
    >>> from ase.build import bulk
    >>> from ase.calculators.emt import EMT
    >>> from alchemi_core import registry
    >>> from alchemi_properties import elastic_tensor
    >>> emt = registry.build("model:ase", calculator_or_factory=EMT)
    >>> [cu] = elastic_tensor([bulk("Cu", "fcc", a=3.59, cubic=True)], emt)
    >>> bool(cu.error is None and cu.tensor.shape == (6, 6) and 100 < cu.tensor[0, 0] < 250)
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

#: The Cartesian pair of each Voigt component, in ASE's order.
VOIGT_PAIRS = ((0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1))


@attrs.frozen
class Moduli:
    """Voigt, Reuss and Hill averages of an elastic tensor (its units)."""

    bulk_voigt: float
    bulk_reuss: float
    bulk_hill: float
    shear_voigt: float
    shear_reuss: float
    shear_hill: float


@attrs.frozen
class ElasticResult:
    """The elastic tensor of one structure.

    Attributes:
        structure: Its index in the input.
        tensor: The 6x6 tensor (GPa, Voigt order ``xx, yy, zz, yz, xz, xy``), None when the
            structure failed.
        moduli: Voigt, Reuss and Hill bulk and shear moduli (GPa) of the tensor's symmetric part.
        warnings: What is wrong with the tensor (not symmetric, not positive definite).
        error: Why there is no tensor (which strained cell failed and why), or None.
    """

    structure: int
    tensor: np.ndarray | None = attrs.field(default=None, eq=False)
    moduli: Moduli | None = None
    warnings: tuple[str, ...] = ()
    error: str | None = None


def voigt_reuss_hill(tensor: np.ndarray) -> Moduli:
    """Bulk and shear moduli of a 6x6 elastic tensor (Voigt notation), in its units.

    The Reuss bounds come from the compliance (the inverse); a singular tensor has NaN ones.

    Example:
        >>> import numpy as np
        >>> c = np.zeros((6, 6)); c[:3, :3] = 50.0; c[range(3), range(3)] = 150.0; c[range(3, 6), range(3, 6)] = 40.0
        >>> m = voigt_reuss_hill(c)
        >>> round(m.bulk_hill, 6), round(m.shear_voigt, 6)
        (83.333333, 44.0)
    """
    c = np.asarray(tensor, dtype=np.float64)
    bulk_voigt = (c[0, 0] + c[1, 1] + c[2, 2] + 2 * (c[0, 1] + c[1, 2] + c[0, 2])) / 9
    shear_voigt = (c[0, 0] + c[1, 1] + c[2, 2] - (c[0, 1] + c[1, 2] + c[0, 2]) + 3 * (c[3, 3] + c[4, 4] + c[5, 5])) / 15
    try:
        s = np.linalg.inv(c)
        bulk_reuss = 1 / (s[0, 0] + s[1, 1] + s[2, 2] + 2 * (s[0, 1] + s[1, 2] + s[0, 2]))
        shear_reuss = 15 / (4 * (s[0, 0] + s[1, 1] + s[2, 2]) - 4 * (s[0, 1] + s[1, 2] + s[0, 2])
                            + 3 * (s[3, 3] + s[4, 4] + s[5, 5]))
    except np.linalg.LinAlgError:
        bulk_reuss = shear_reuss = float("nan")
    return Moduli(float(bulk_voigt), float(bulk_reuss), float((bulk_voigt + bulk_reuss) / 2),
                  float(shear_voigt), float(shear_reuss), float((shear_voigt + shear_reuss) / 2))


def strain_matrix(component: int, strain: float) -> np.ndarray:
    """The symmetric 3x3 strain of Voigt ``component`` (0-5) by ``strain`` (engineering for shear).

    Example:
        >>> strain_matrix(3, 0.02).tolist()[1]
        [0.0, 0.0, 0.01]
    """
    i, j = VOIGT_PAIRS[component]
    eps = np.zeros((3, 3))
    eps[i, j] = eps[j, i] = strain if i == j else strain / 2
    return eps


def elastic_tensor(
    structures: Sequence[ase.Atoms | AtomicData] | Batch,
    model: Any,
    *,
    strain: float = 0.01,
    relax_positions: bool = True,
    fmax: float = 1e-3,
    max_steps: int = 1000,
    symmetry_tolerance: float = 0.01,
    dtype: torch.dtype | None = torch.float64,
    device: str | torch.device | None = None,
    max_atoms: int | None = None,
    max_batch_size: int | None = None,
    progress: bool = False,
) -> list[ElasticResult]:
    """The elastic tensor of each structure (see the module docstring).

    Args:
        structures: ASE ``Atoms``, ``AtomicData`` or a ``Batch``, periodic in 3 dimensions.
        model: An alchemi model that gives stress, on the device to run on.
        strain: The strain of each step (dimensionless, 0 < strain <= 0.1).
        relax_positions: Relax the positions in each strained cell (FIRE at fixed cell), else
            keep them clamped (the clamped-ion tensor).
        fmax: Force threshold of that relaxation (eV/Å).
        max_steps: Most FIRE steps per strained cell; one that does not converge fails its
            structure.
        symmetry_tolerance: Largest ``|C - C^T|`` as a fraction of ``max |C|`` without a warning.
        dtype: Floating dtype of positions and results (float64: differences amplify round-off).
        device: Where to run (default: where the model's parameters are).
        max_atoms: Most atoms per batch (None: planned from the device's memory and the model).
        max_batch_size: Most structures per batch.
        progress: Show a progress bar.

    Returns:
        One :class:`ElasticResult` per structure, in input order; a structure that fails has
        ``error`` set and is never dropped.

    Raises:
        ConfigurationError: No structures, a strain out of range, or a model without stress.
    """
    from alchemi_core.models.base import model_card

    if not 0 < strain <= 0.1:
        raise ConfigurationError(f"elastic_tensor: strain must lie in (0, 0.1], got {strain}")
    card = model_card(model)
    if not card.stress:
        raise ConfigurationError(f"elastic_tensor: model {card.name!r} gives no stress; use a model that does")

    def strained_cells(atoms: ase.Atoms) -> list[ase.Atoms]:
        out = []
        for component in range(6):
            for sign in (-1, 1):  # derived index 2 * component + (sign > 0)
                strained = atoms.copy()
                strained.set_cell(atoms.cell[:] @ (np.eye(3) + strain_matrix(component, sign * strain)),
                                  scale_atoms=True)
                out.append(strained)
        return out

    per_structure = run_per_structure(
        structures, strained_cells, model, relax_positions=relax_positions, compute_stress=True, fmax=fmax,
        max_steps=max_steps, dtype=dtype, device=device, max_atoms=max_atoms, max_batch_size=max_batch_size,
        progress=progress,
    )
    results = [ElasticResult(i, error=r) if isinstance(r, str) else _tensor(i, r, strain, symmetry_tolerance)
               for i, (_, r) in enumerate(per_structure)]
    for r in results:
        for w in r.warnings:
            warnings.warn(f"elastic_tensor: structure {r.structure}: the tensor is {w}", stacklevel=2)
    return results


def _tensor(structure: int, results: list[ase.Atoms], strain: float, symmetry_tolerance: float) -> ElasticResult:
    """The tensor of one structure from its 12 strained cells (in derived order), or why not."""
    failed = [f"strain {_describe(a.info['derived'])}: {a.info['failure']}" for a in results if "failure" in a.info]
    if failed:
        return ElasticResult(structure, error="; ".join(failed))
    stress = np.array([a.get_stress(voigt=True) for a in results]).reshape(6, 2, 6)  # [component, -/+, voigt]
    tensor = (stress[:, 1] - stress[:, 0]).T / (2 * strain) * EV_PER_A3_TO_GPA
    found = []
    scale = np.abs(tensor).max()
    asymmetry = np.abs(tensor - tensor.T).max() / scale if scale > 0 else 0.0
    if asymmetry > symmetry_tolerance:
        found.append(f"not symmetric: max |C - C^T| is {asymmetry:.2%} of max |C| "
                     f"(above {symmetry_tolerance:.2%}); relax the structure (cell included) first or lower fmax")
    symmetric = (tensor + tensor.T) / 2
    lowest = float(np.linalg.eigvalsh(symmetric).min())
    if lowest <= 0:
        found.append(f"not positive definite (lowest eigenvalue {lowest:.4g} GPa): mechanically unstable")
    return ElasticResult(structure, tensor, voigt_reuss_hill(symmetric), tuple(found))


def _describe(derived_index: int) -> str:
    """``"-xx"``, ``"+yz"``, ...: the strained cell ``derived_index`` of a structure."""
    names = ("xx", "yy", "zz", "yz", "xz", "xy")
    return f"{'-+'[derived_index % 2]}{names[derived_index // 2]}"
