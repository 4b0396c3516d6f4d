"""``AlchemiCalculator``: any alchemi model as an ASE calculator, so ASE's own tools (NEB,
vibrations, phonons, its optimisers) can use a model where alchemi has no batched version.

Each calculation converts the ``Atoms`` with alchemi's ASE conversion
(:meth:`alchemi_core.data.Batch.from_atoms`) into a batch of one system and calls the model as a
run does (its input checks, its own neighbour list, ``verify``). It gives ``energy``,
``free_energy`` (the same number), ``forces``, ``stress`` (Voigt order, eV/Å³, ASE's sign)
where the model gives stress and the atoms are periodic, and ``energies`` (per atom) and
``charges`` where the model returns them under those keys. ASE applies the ``Atoms``'
constraints itself, so the calculator passes none to the model.

Build one with :meth:`alchemi_core.models.BaseModel.as_ase_calculator`, which needs ASE
(``pip install "alchemi-core[ase]"``).

Example:
    >>> from ase import Atoms
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> atoms = Atoms("CO", positions=[[0, 0, 0], [1.2, 0, 0]])
    >>> atoms.calc = DemoModelWrapper().as_ase_calculator()
    >>> atoms.get_forces().shape
    (2, 3)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from ase.calculators.calculator import Calculator, PropertyNotImplementedError, all_changes
from ase.stress import full_3x3_to_voigt_6_stress


class AlchemiCalculator(Calculator):
    """An alchemi model behind ASE's ``Calculator`` interface (see the module docstring).

    Args:
        model: Any alchemi model (``model(batch, compute_stress=...)``).
        device: Where the model runs (default: the device of its parameters or buffers, else the CPU).
        dtype: The positions' dtype (default: that of its floating parameters or buffers, else float64).
    """

    def __init__(self, model: Any, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.model = model
        card = getattr(model, "card", None)  # a ModelCard (read here: models.base imports this module)
        self.model_name = str(getattr(card, "name", type(model).__name__))
        self.gives_stress = bool(getattr(card, "stress", False))
        tensors = _tensors(model)
        self.device = torch.device(device) if device is not None else (
            tensors[0].device if tensors else torch.device("cpu"))
        floats = [t.dtype for t in tensors if t.dtype.is_floating_point]
        self.dtype = dtype if dtype is not None else (floats[0] if floats else torch.float64)
        stress = ["stress"] if self.gives_stress else []
        # Per-atom results are listed so ASE asks for them; a model that does not return them
        # makes ASE say "energies not present in this calculation".
        self.implemented_properties = ["energy", "free_energy", "forces", *stress, "energies", "charges"]

    def calculate(self, atoms: Any = None, properties: Any = ("energy",), system_changes: Any = all_changes) -> None:
        """Evaluate the model on ``atoms`` and fill ``self.results`` (ASE's calculator protocol).

        Raises:
            PropertyNotImplementedError: Stress asked of atoms that are not periodic in all three
                directions, or of a model that gives none.
            InvalidDataError: What the model's input checks raise (an element it does not know).
        """
        from alchemi_core.data import Batch

        super().calculate(atoms, properties, system_changes)
        current: Any = self.atoms  # the copy ASE's calculate just took
        stress = "stress" in properties
        if stress and not (self.gives_stress and bool(current.pbc.all())):
            why = "gives no stress" if not self.gives_stress else "needs atoms periodic in x, y and z for stress"
            raise PropertyNotImplementedError(f"model {self.model_name!r} {why} (pbc={current.pbc.tolist()})")
        plain = current.copy()  # no calculator (its results would enter the batch) and no constraints
        plain.set_constraint()
        batch = Batch.from_atoms(plain, device=self.device, dtype=self.dtype)
        out = self.model(batch, compute_stress=True) if stress else self.model(batch)
        energy = float(out["energy"].detach().reshape(-1)[0])
        self.results = {"energy": energy, "free_energy": energy, "forces": _numpy(out["forces"]).reshape(-1, 3)}
        if stress:
            self.results["stress"] = full_3x3_to_voigt_6_stress(_numpy(out["stress"]).reshape(3, 3))
        for key in ("energies", "charges"):
            if out.get(key) is not None:
                self.results[key] = _numpy(out[key]).reshape(len(plain))


def _tensors(model: Any) -> list[torch.Tensor]:
    """The model's parameters and buffers (none for a plain callable)."""
    if not isinstance(model, torch.nn.Module):
        return []
    return [*model.parameters(), *model.buffers()]


def _numpy(t: torch.Tensor) -> np.ndarray:
    # A copy: a model may return the batch's own buffers, which the next call overwrites.
    return np.array(t.detach().to("cpu", torch.float64).numpy())
