"""``AseCalculatorModel`` (``model:ase``): any ASE calculator as an alchemi model, system by
system on the CPU (for checking results and existing calculators, not for speed). ASE's stress has
alchemi's sign; it is returned as ``[B, 3, 3]``.

Example:
    >>> from ase.calculators.emt import EMT
    >>> model = AseCalculatorModel(EMT)      # a factory: one calculator per batch slot
    >>> model.card.name
    'ase:EMT'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from alchemi_core.errors import ConfigurationError, InvalidDataError, MissingDependencyError
from alchemi_core.models.base import BaseModel, ModelCard

if TYPE_CHECKING:
    from alchemi_core.data import Batch


def _require_ase() -> Any:
    try:
        import ase
    except ImportError:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            "model:ase needs ASE; install it with: pip install 'alchemi-potentials[ase]'"
        ) from None
    return ase


class AseCalculatorModel(BaseModel):
    """Wrap an ASE calculator (see the module docstring).

    Args:
        calculator_or_factory: A calculator shared by all systems, or a callable returning a new
            one, called once per batch slot (for calculators with per-structure state).

    Raises:
        ConfigurationError: The argument is neither a calculator nor a callable.
        MissingDependencyError: ASE is not installed.
    """

    def __init__(self, calculator_or_factory: Any) -> None:
        super().__init__()
        _require_ase()
        from ase.calculators.calculator import BaseCalculator

        if isinstance(calculator_or_factory, BaseCalculator):
            self._shared: Any = calculator_or_factory
            self._factory: Callable[[], Any] | None = None
            label = type(calculator_or_factory).__name__
            stress = "stress" in getattr(calculator_or_factory, "implemented_properties", ("stress",))
        elif callable(calculator_or_factory):
            self._shared = None
            self._factory = calculator_or_factory
            label = getattr(calculator_or_factory, "__name__", type(calculator_or_factory).__name__)
            stress = "stress" in getattr(calculator_or_factory, "implemented_properties", ("stress",))
        else:
            raise ConfigurationError(
                "model:ase takes an ASE calculator or a callable that returns one, got "
                f"{type(calculator_or_factory).__name__}"
            )
        self._per_slot: list[Any] = []
        self.card = ModelCard(name=f"ase:{label}", cutoff=None, periodic=True, stress=stress)

    def calculator(self, slot: int) -> Any:
        """The calculator that evaluates batch slot ``slot``."""
        if self._factory is None:
            return self._shared
        while len(self._per_slot) <= slot:
            self._per_slot.append(self._factory())
        return self._per_slot[slot]

    def forward(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        """Energies ``[B, 1]``, forces ``[V, 3]`` and, when asked, stress ``[B, 3, 3]``.

        Raises:
            InvalidDataError: The calculator cannot give a property for a system (e.g. stress of
                a structure without a 3-D cell); the message names the system.
        """
        import ase
        from ase.calculators.calculator import PropertyNotImplementedError

        pos = batch.positions
        n = batch.num_graphs
        numbers = batch.atomic_numbers.detach().cpu().numpy()
        positions = pos.detach().to("cpu", torch.float64).numpy()
        cells = batch.cell.detach().to("cpu", torch.float64).numpy() if "cell" in batch else np.zeros((n, 3, 3))
        pbc = batch.pbc.detach().cpu().numpy().astype(bool) if "pbc" in batch else np.zeros((n, 3), dtype=bool)
        ptr = np.concatenate(([0], np.cumsum(batch.num_nodes_per_system)))
        energy = np.zeros((n, 1))
        forces = np.zeros_like(positions)
        stress = np.zeros((n, 3, 3))
        for s in range(n):
            lo, hi = int(ptr[s]), int(ptr[s + 1])
            atoms = ase.Atoms(numbers=numbers[lo:hi], positions=positions[lo:hi], cell=cells[s], pbc=pbc[s])
            atoms.calc = self.calculator(s)
            try:
                energy[s, 0] = atoms.get_potential_energy()
                forces[lo:hi] = atoms.get_forces()
                if compute_stress:
                    stress[s] = atoms.get_stress(voigt=False)
            except PropertyNotImplementedError as exc:
                raise InvalidDataError(
                    f"{self.card.name} cannot evaluate system {s} (pbc {pbc[s].tolist()}): {exc}; stress needs "
                    "a periodic structure with a 3-D cell and a calculator that implements it"
                ) from exc
        like = {"dtype": pos.dtype, "device": pos.device}
        out = {"energy": torch.as_tensor(energy, **like), "forces": torch.as_tensor(forces, **like)}
        if compute_stress:
            out["stress"] = torch.as_tensor(stress, **like)
        return out
