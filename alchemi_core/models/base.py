"""The model interface: what the dynamics engine calls once per step.

A model is a callable ``model(batch, compute_stress=False)`` returning a mapping with

* ``"energy"``: ``[B, 1]`` eV, one row per system,
* ``"forces"``: ``[V, 3]`` eV/Å, one row per atom,
* ``"stress"``: ``[B, 3, 3]`` eV/Å³ (positive under tension) when ``compute_stress`` is True.

A model declares what it needs through :class:`ModelCard` (its cutoff, whether it handles
periodic cells, whether it can give stress) and keeps whatever neighbour data it needs itself,
rebuilt when ``batch.version`` changes: a user never wires a neighbour list by hand. The engine
calls ``check_batch(batch)`` when systems enter and ``verify(batch)`` at check steps (the only
places a model may read values back from the device to raise an error).

For speed on a GPU a model's forward should make no host synchronisation and, after the first
call for a given ``batch.version``, allocate nothing, so a step can be captured as a CUDA graph.

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

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs
import torch

if TYPE_CHECKING:
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
    """

    name: str = "model"
    cutoff: float | None = None
    periodic: bool = False
    stress: bool = False
    species: tuple[int, ...] | None = None


@runtime_checkable
class Model(Protocol):
    """Anything the engine can call for energies and forces."""

    def __call__(self, batch: Batch, compute_stress: bool = False) -> Mapping[str, torch.Tensor]: ...


class BaseModel(torch.nn.Module):
    """Convenience base class: a ``torch.nn.Module`` with a :class:`ModelCard` and input checks."""

    card: ModelCard = ModelCard()

    def forward(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:  # pragma: no cover
        raise NotImplementedError

    def check_batch(self, batch: Batch) -> None:
        """Reject a batch this model cannot evaluate, with a message that says why.

        The engine calls it when a run starts and whenever new systems enter (not per step).
        The default checks species against ``card.species``.

        Raises:
            InvalidDataError: An unknown species, or another input the model cannot handle.
        """
        from alchemi_core.errors import InvalidDataError

        species = self.card.species
        if species is None or batch.num_nodes == 0:
            return
        numbers = batch.atomic_numbers
        if bool(_known_species(tuple(species), numbers.device)[_table_index(numbers)].all()):
            return
        present = set(torch.unique(numbers).tolist())  # only to name the unknown ones
        unknown = sorted(present - set(species))
        if unknown:
            raise InvalidDataError(
                f"model {self.card.name!r} has no parameters for atomic numbers {unknown}; "
                f"it knows {sorted(species)}"
            )


    def verify(self, batch: Batch) -> None:
        """Raise errors the model detected on the device since the last call (a neighbour list
        that overflowed, a cutoff beyond what it was built for).

        The engine calls it at check steps, where reading back from the device is allowed, and
        right after the forward that follows a run's start or a refill, so that systems a model
        cannot hold (more neighbours than a fixed capacity) are reported before any step uses
        their results; the forward itself never synchronises. The default does nothing.
        """


def model_card(model: Any) -> ModelCard:
    """The card of any model (a default card for plain callables)."""
    card = getattr(model, "card", None)
    return card if isinstance(card, ModelCard) else ModelCard(name=type(model).__name__)


#: The highest atomic number the species tables hold; numbers beyond it are never known.
_TOP_NUMBER = 127
_species_tables: dict[tuple[tuple[int, ...], torch.device], torch.Tensor] = {}


def _known_species(species: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """``[_TOP_NUMBER + 3]`` bool on ``device``: entry ``z + 1`` is True for a known atomic number
    ``z``; the first and last entries (numbers below 0 and above the table) are False.

    A lookup and one read-back per check: ``torch.unique`` over a batch's atoms sorts them all
    (W2's 221,184 atoms: 3.3 against 1.1 ms on a 2-core CPU) and synchronises twice on a GPU.
    """
    key = (species, device)
    table = _species_tables.get(key)
    if table is None:
        table = torch.zeros(_TOP_NUMBER + 3, dtype=torch.bool)
        table[[z + 1 for z in species if 0 <= z <= _TOP_NUMBER]] = True
        table = _species_tables[key] = table.to(device)
    return table


def _table_index(numbers: torch.Tensor) -> torch.Tensor:
    return (numbers.long() + 1).clamp_(0, _TOP_NUMBER + 2)
