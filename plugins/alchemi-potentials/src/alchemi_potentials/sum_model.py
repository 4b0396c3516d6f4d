"""``SumModel`` (``model:sum``): several models added together, e.g. SevenNet + D3. The card
takes the largest cutoff, the species every part knows, and stress when every part gives it.
A part that returns per-atom partial charges (``"charges"``, ``[V]`` e) hands them to the parts
after it that take them (``takes_charges = True``: ``model:ewald``, ``model:pme``, ``model:dsf``);
the sum returns the last such charges. Parts may be models or registry specs (``"model:d3"``,
``{"model": "model:d3", ...}``).

Example:
    >>> from alchemi_potentials import LennardJones, Morse
    >>> both = SumModel([LennardJones(epsilon=0.0104, sigma=3.405, cutoff=8.5),
    ...                  Morse(D=0.01, alpha=1.5, r0=3.8, cutoff=7.0)])
    >>> both.card.cutoff
    8.5
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from alchemi_core.errors import ConfigurationError
from alchemi_core.models.base import BaseModel, ModelCard, check_input, model_card

if TYPE_CHECKING:
    from alchemi_core.data import Batch


def _build(part: Any) -> Any:
    from alchemi_core import registry

    if isinstance(part, str):
        return registry.build(part)
    if isinstance(part, Mapping):
        spec = dict(part)
        name = spec.pop("model", None)
        if not isinstance(name, str):
            raise ConfigurationError(f"model:sum: a part given as a table needs model = 'model:<name>', got {part!r}")
        return registry.build(name, **spec)
    if callable(part):
        return part
    raise ConfigurationError(f"model:sum: a part must be a model, 'model:<name>' or a table, got {type(part).__name__}")


class SumModel(BaseModel):
    """The sum of ``models`` (see the module docstring).

    Raises:
        ConfigurationError: Fewer than one part, or a part that is not a model or a spec.
    """

    def __init__(self, models: Sequence[Any]) -> None:
        super().__init__()
        if isinstance(models, (str, Mapping)) or not len(models):
            raise ConfigurationError("model:sum needs a list of one or more models")
        parts = [_build(m) for m in models]
        self.parts = parts
        for i, m in enumerate(parts):
            if isinstance(m, torch.nn.Module):
                self.add_module(f"part{i}", m)
        cards = [model_card(m) for m in parts]
        cutoffs = [c.cutoff for c in cards]
        species = [set(c.species) for c in cards if c.species is not None]
        self.card = ModelCard(
            name="+".join(c.name for c in cards),
            cutoff=None if None in cutoffs else max(c for c in cutoffs if c is not None),
            periodic=all(c.periodic for c in cards),
            stress=all(c.stress for c in cards),
            species=tuple(sorted(set.intersection(*species))) if species else None,
            needs_charge=any(c.needs_charge for c in cards),
            needs_spin=any(c.needs_spin for c in cards),
        )
        self.cuda_graphs = all(getattr(m, "cuda_graphs", True) for m in parts)

    def forward(self, batch: Batch, compute_stress: bool = False) -> dict[str, torch.Tensor]:
        """The parts' energies ``[B, 1]``, forces ``[V, 3]`` (and stress ``[B, 3, 3]``), added;
        the partial ``charges`` ``[V]`` of the last part that predicts them."""
        total: dict[str, torch.Tensor] = {}
        for m in self.parts:
            kwargs: dict[str, Any] = {"compute_stress": True} if compute_stress else {}
            if "charges" in total and getattr(m, "takes_charges", False):
                kwargs["charges"] = total["charges"]
            out = m(batch, **kwargs)
            if "charges" in out:
                total["charges"] = out["charges"]
            for key in ("energy", "forces", "stress"):
                if key in out:
                    value = out[key].reshape(batch.num_graphs, 1) if key == "energy" else out[key]
                    total[key] = value.clone() if key not in total else total[key] + value
        return total

    def bytes_per_atom(self) -> float:
        """The parts' per-atom device bytes, added (parts without an estimate count zero)."""
        return float(sum(m.bytes_per_atom() for m in self.parts if callable(getattr(m, "bytes_per_atom", None))))

    def check_batch(self, batch: Batch) -> None:
        for m in self.parts:
            check_input(m, batch)  # remembered, so the parts' own calls check nothing again

    def verify(self, batch: Batch) -> None:
        for m in self.parts:
            verify = getattr(m, "verify", None)
            if verify is not None:
                verify(batch)

    def error_flag(self, batch: Batch) -> torch.Tensor | None:
        """True on the device when a part's ``verify`` may raise; None when a part that verifies
        cannot say so without reading back (then the engine calls :meth:`verify`)."""
        flags = []
        for m in self.parts:
            if getattr(m, "verify", None) is None:
                continue
            flag = getattr(m, "error_flag", lambda b: None)(batch)
            if flag is None:
                return None
            flags.append(flag)
        if not flags:
            return None
        return torch.stack([f.reshape(()) for f in flags]).any()
