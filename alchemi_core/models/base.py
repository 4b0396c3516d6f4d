"""The model interface: what the dynamics engine calls once per step.

A model is a callable ``model(batch, compute_stress=False)`` returning a mapping with

* ``"energy"``: ``[B, 1]`` eV, one row per system,
* ``"forces"``: ``[V, 3]`` eV/Å, one row per atom,
* ``"stress"``: ``[B, 3, 3]`` eV/Å³ (positive under tension) when ``compute_stress`` is True.

A model declares what it needs through :class:`ModelCard` and keeps whatever neighbour data it
needs itself, rebuilt when ``batch.version`` changes. The engine calls ``check_batch(batch)`` when
systems enter and ``verify(batch)`` at check steps (the only places a model may read values back
from the device to raise an error). A :class:`BaseModel` called directly (outside a run) makes the
same checks itself, once per batch object. A forward should make no host synchronisation and,
after the first call for a given ``batch.version``, allocate nothing (CUDA graph capture).

Example:
    >>> import torch
    >>> from alchemi_core.models import BaseModel, ModelCard
    >>> class Harmonic(BaseModel):
    ...     card = ModelCard(name="harmonic", cutoff=None, periodic=False)
    ...     def forward(self, batch, compute_stress=False):
    ...         e = 0.5 * (batch.positions ** 2).sum(-1)
    ...         energy = torch.zeros(batch.num_graphs, 1, dtype=e.dtype).index_add_(0, batch.batch_idx, e[:, None])
    ...         return {"energy": energy, "forces": -batch.positions}
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import attrs
import torch

from alchemi_core.data.elements import LAST_ELEMENT, unknown_elements

if TYPE_CHECKING:
    from ase.calculators.calculator import Calculator

    from alchemi_core.data import Batch


@attrs.frozen
class ModelCard:
    """What a model needs and gives.

    Attributes:
        name: Short name for messages and logs.
        cutoff: Interaction range in Å (None: all pairs within a system).
        periodic: True when the model applies periodic boundary conditions from ``cell``/``pbc``.
        stress: True when the model can return stress.
        species: Atomic numbers the model has parameters for (None: any).
        needs_charge: The model reads each system's total charge (the system field ``charge``,
            ``atoms.info["charge"]``, in e).
        needs_spin: The model reads each system's spin multiplicity (``spin``,
            ``atoms.info["spin"]``, 2S + 1).
    """

    name: str = "model"
    cutoff: float | None = None
    periodic: bool = False
    stress: bool = False
    species: tuple[int, ...] | None = None
    needs_charge: bool = False
    needs_spin: bool = False


#: The directory of model files that model names resolve from first.
MODEL_DIR_VARIABLE = "ALCHEMI_MODEL_DIR"


@attrs.frozen
class KnownModel:
    """A published model that a family resolves by name (``alchemi list-components --models``).

    A model class lists its names with a ``known_models()`` classmethod returning these.

    Attributes:
        name: The name users pass (``"mace-mp-0-small"``).
        file: The file the name stands for, as published (what to place in ``$ALCHEMI_MODEL_DIR``).
        path: Where the file is on this machine; None when it is not here.

    Example:
        >>> KnownModel("7net-0", "checkpoint_sevennet_0.pth", None).present
        False
    """

    name: str
    file: str
    path: str | None

    @property
    def present(self) -> bool:
        """The file is on this machine."""
        return self.path is not None


@runtime_checkable
class Model(Protocol):
    """Anything the engine can call for energies and forces."""

    def __call__(self, batch: Batch, compute_stress: bool = False) -> Mapping[str, torch.Tensor]: ...


class BaseModel(torch.nn.Module):
    """Convenience base class: a ``torch.nn.Module`` with a :class:`ModelCard` and input checks
    that direct calls make too (see the module docstring)."""

    card: ModelCard = ModelCard()
    #: What to do about elements the model has no parameters for (ends that message).
    species_hint: ClassVar[str] = ""

    def forward(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:  # pragma: no cover
        raise NotImplementedError

    def __call__(self, batch: Batch, *args: Any, **kwargs: Any) -> Any:
        """The forward, after the checks a run makes when systems enter for a batch object not
        checked yet (a direct call); then ``verify``."""
        stress = bool(args[0] if args else kwargs.get("compute_stress", False))
        direct = self._check_once(batch, stress)
        out = super().__call__(batch, *args, **kwargs)
        if direct:
            try:
                self.verify(batch)
            except Exception:
                self._forget(batch)  # and again at the next call
                raise
        return out

    def check_batch(self, batch: Batch) -> None:
        """Reject a batch this model cannot evaluate, with a message that says why (called when
        systems enter, not per step). The default runs :meth:`check_species` and, for a periodic
        model, :meth:`check_cells`.

        Raises:
            InvalidDataError: An unknown species, or another input the model cannot handle.
        """
        self.check_species(batch)
        if self.card.periodic:
            self.check_cells(batch)
        check_charge_and_spin(self.card, batch)

    def check_species(self, batch: Batch) -> None:
        """Refuse atomic numbers that are no element and, when ``card.species`` is set,
        elements the model has no parameters for (one read-back).

        Raises:
            InvalidDataError: Names the unknown atomic numbers (and what the model knows).
        """
        from alchemi_core.errors import InvalidDataError

        if batch.num_nodes == 0:
            return
        species = self.card.species
        known = tuple(species) if species is not None else _ANY_ELEMENT
        numbers = batch.atomic_numbers
        if bool(_known_species(known, numbers.device)[_table_index(numbers)].all()):
            return
        present = set(torch.unique(numbers).tolist())  # only to name the unknown ones
        unknown = sorted(present - set(known))
        if not unknown:
            return  # numbers the card lists beyond the lookup table
        not_elements = unknown_elements(unknown)
        if not_elements:
            raise InvalidDataError(f"model {self.card.name!r}: {not_elements}")
        hint = f"; {self.species_hint}" if self.species_hint else ""
        raise InvalidDataError(
            f"model {self.card.name!r} has no parameters for atomic numbers {unknown}; "
            f"it knows {sorted(known)}{hint}"
        )

    def check_cells(self, batch: Batch) -> None:
        """Refuse periodic systems without a usable cell (a periodic axis without a cell row,
        or periodic rows of zero length, area or volume; one read-back).

        Raises:
            InvalidDataError: Names the systems and their cells.
        """
        from alchemi_core.data.cells import check_cells

        check_cells(batch, self.card.name)

    def check_stress(self, batch: Batch) -> None:
        """Reject stress asked of systems without a cell to take it over (a molecule); called
        when systems enter a run that needs stress.

        Raises:
            InvalidDataError: Systems without a cell or with a cell of zero volume, named by
                their index and ``system_id``.
        """
        from alchemi_core.errors import InvalidDataError

        if not self.card.stress or batch.num_graphs == 0:
            return
        if "cell" in batch:
            cell = batch.cell.detach().reshape(-1, 3, 3).double()
            volume = torch.linalg.det(cell).abs()
            scale = torch.linalg.vector_norm(cell, dim=2).prod(dim=1)  # the volume of a cube of those edges
            bad = ~(volume > 1e-10 * scale) | ~torch.isfinite(volume)
        else:
            bad = torch.ones(batch.num_graphs, dtype=torch.bool, device=batch.positions.device)
        index = torch.nonzero(bad).view(-1).cpu()
        if len(index):
            ids = batch.system_id.view(-1).cpu()[index] if "system_id" in batch else index
            raise InvalidDataError(
                f"model {self.card.name!r}: stress was asked of systems {index[:10].tolist()} (system_id "
                f"{ids[:10].tolist()}) that have no cell or a cell of zero volume (a molecule has no volume "
                "to take stress over); give them a cell, or ask for energy and forces only"
            )

    def as_ase_calculator(self, device: torch.device | str | None = None,
                          dtype: torch.dtype | None = None) -> Calculator:
        """This model as an ASE calculator (:class:`~alchemi_core.models.ase_calculator.AlchemiCalculator`):
        energy, free energy, forces, stress (periodic atoms, where the card says the model gives
        it) and per-atom ``energies``/``charges`` where the model returns them.

        Args:
            device: Where the model runs (default: where its parameters are, else the CPU).
            dtype: The positions' dtype (default: its parameters', else float64).

        Raises:
            MissingDependencyError: ASE is not installed.

        Example:
            >>> from ase.build import molecule
            >>> from alchemi_core.models.demo import DemoModelWrapper
            >>> atoms = molecule("H2O")
            >>> atoms.calc = DemoModelWrapper().as_ase_calculator()
            >>> atoms.calc.implemented_properties[:3]
            ['energy', 'free_energy', 'forces']
            >>> bool(abs(atoms.get_forces().sum(axis=0)).max() < 1e-12)   # no net force
            True
        """
        try:
            import ase  # noqa: F401 - an optional dependency, named in the error below
        except ImportError:
            from alchemi_core.errors import MissingDependencyError

            raise MissingDependencyError(
                f"model {self.card.name!r}: as_ase_calculator needs ASE; install it with "
                "pip install 'alchemi-core[ase]'"
            ) from None
        from alchemi_core.models.ase_calculator import AlchemiCalculator

        return AlchemiCalculator(self, device=device, dtype=dtype)

    def verify(self, batch: Batch) -> None:
        """Raise errors the model detected on the device since the last call (a neighbour list
        that overflowed). Called at check steps and right after the forward that follows a run's
        start or a refill. The default does nothing."""

    # ------------------------------------------------------------------ checked batches
    def _checked(self) -> weakref.WeakValueDictionary[tuple[int, bool], Any]:
        """Batches that passed ``check_batch`` (key ``(id, False)``) and :meth:`check_stress`
        (``(id, True)``), weakly held. Keyed on the object, not its version: a run checks the
        systems that enter itself, and a second whole-batch check per refill costs more than a step."""
        checked = self.__dict__.get("_checked_batches")
        if checked is None:
            checked = self.__dict__["_checked_batches"] = weakref.WeakValueDictionary()
        return checked

    def _check_once(self, batch: Batch, stress: bool) -> bool:
        """Make the checks ``batch`` has not passed yet; True when any ran."""
        checked = self._checked()
        ran = False
        for stress_check in (False, True) if stress else (False,):
            key = (id(batch), stress_check)
            if checked.get(key) is not batch:
                if stress_check:
                    self.check_stress(batch)
                else:
                    self.check_batch(batch)
                checked[key] = batch
                ran = True
        return ran

    def _forget(self, batch: Batch) -> None:
        for stress_check in (False, True):
            self._checked().pop((id(batch), stress_check), None)

    def __getstate__(self) -> dict[str, Any]:
        # Weak references do not pickle; a copy has checked no batch yet.
        state = dict(super().__getstate__())
        state.pop("_checked_batches", None)
        return state


def check_input(model: Any, batch: Batch, stress: bool = False) -> None:
    """What a run checks when systems enter: ``model.check_batch(batch)`` and, when the run
    needs stress, :meth:`BaseModel.check_stress`. A :class:`BaseModel` remembers the batch, so
    its own calls on it check nothing again; a plain callable without ``check_batch`` passes.

    Raises:
        InvalidDataError: What the model's checks raise.
    """
    if isinstance(model, BaseModel):
        model._forget(batch)  # a run checks what enters even if a direct call saw this object
        model._check_once(batch, stress)
        return
    check = getattr(model, "check_batch", None)
    if check is not None:
        check(batch)


def check_charge_and_spin(card: ModelCard, batch: Batch) -> None:
    """Refuse a batch without the total charge or spin multiplicity ``card`` needs (a spin of
    0 means "not given"; one read-back when the card needs spin).

    Raises:
        InvalidDataError: Names the field and the value to set.

    Example:
        >>> import torch
        >>> from alchemi_core.data import AtomicData, Batch
        >>> h = Batch.from_data_list([AtomicData(atomic_numbers=[1], positions=torch.zeros(1, 3), charge=0, spin=2)])
        >>> check_charge_and_spin(ModelCard(needs_charge=True, needs_spin=True), h)
    """
    from alchemi_core.errors import InvalidDataError

    if card.needs_charge and "charge" not in batch:
        raise InvalidDataError(
            f"model {card.name!r} needs each structure's total charge (the system field 'charge', in e); "
            "set it, e.g. atoms.info['charge'] = 0 for a neutral structure, before converting"
        )
    if card.needs_spin and ("spin" not in batch or not bool((batch.spin > 0).all())):
        raise InvalidDataError(
            f"model {card.name!r} needs each structure's spin multiplicity 2S + 1 (the system field 'spin'), "
            "and some structure has none; set it, e.g. atoms.info['spin'] = 1 for a closed shell"
        )


def model_card(model: Any) -> ModelCard:
    """The card of any model (a default card for plain callables)."""
    card = getattr(model, "card", None)
    return card if isinstance(card, ModelCard) else ModelCard(name=type(model).__name__)


#: The highest atomic number the species tables hold; numbers beyond it are never known.
_TOP_NUMBER = 127
#: What a model without ``card.species`` takes: the elements, and 0 (a dummy atom, as in ASE).
_ANY_ELEMENT = tuple(range(0, LAST_ELEMENT + 1))
_species_tables: dict[tuple[tuple[int, ...], torch.device], torch.Tensor] = {}


def _known_species(species: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``[_TOP_NUMBER + 3]`` bool on ``device``: entry ``z + 1`` is True for a known atomic number
    ``z``; the first and last entries (numbers below 0 and above the table) are False. (A lookup
    and one read-back: ``torch.unique`` would sort every atom and synchronise twice.)"""
    key = (species, device)
    table = _species_tables.get(key)
    if table is None:
        table = torch.zeros(_TOP_NUMBER + 3, dtype=torch.bool)
        table[[z + 1 for z in species if 0 <= z <= _TOP_NUMBER]] = True
        table = _species_tables[key] = table.to(device)
    return table


def _table_index(numbers: torch.Tensor) -> torch.Tensor:
    return (numbers.long() + 1).clamp_(0, _TOP_NUMBER + 2)
