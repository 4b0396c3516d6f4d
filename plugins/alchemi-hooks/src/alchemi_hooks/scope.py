"""Which systems and atoms a hook acts on.

Inside a stage the engine keeps ``dynamics.context.system_mask`` (``[B]`` bool, None for all) on
the systems that stage integrates; a hook acts on those only. The engine changes its masks only
at check steps and gives the context a new ``version`` when it does; the atom views derived here
are cached on that number.

Example:
    >>> import torch
    >>> from types import SimpleNamespace
    >>> from alchemi_core.dynamics import StepContext
    >>> from alchemi_core.testing import make_batch
    >>> from alchemi_hooks.scope import Scope
    >>> batch = make_batch([2, 3])
    >>> stage = SimpleNamespace(context=StepContext.standalone(batch, system_mask=torch.tensor([False, True])))
    >>> Scope().atoms(batch, stage).tolist()
    [False, False, True, True, True]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from alchemi_core.data import Batch


class Scope:
    """Per-hook cache of the systems (``[B]`` bool) and atoms (``[V]`` bool) of its stage."""

    def __init__(self) -> None:
        self._atom_key: Any = None
        self._atoms: torch.Tensor | None = None
        self._outside: torch.Tensor | None = None

    def systems(self, batch: Batch, dynamics: Any) -> torch.Tensor | None:
        """``[B]`` bool, True for the systems the hook acts on; None means every system."""
        mask: torch.Tensor | None = dynamics.context.system_mask
        return mask

    def atoms(self, batch: Batch, dynamics: Any) -> torch.Tensor | None:
        """``[V]`` bool, True for atoms of the systems the hook acts on; None means every atom."""
        self._refresh_atoms(batch, dynamics)
        return self._atoms

    def atoms_outside(self, batch: Batch, dynamics: Any) -> torch.Tensor | None:
        """``[V, 1]`` bool, True for atoms the hook must leave alone; None when it acts on all."""
        self._refresh_atoms(batch, dynamics)
        return self._outside

    def _refresh_atoms(self, batch: Batch, dynamics: Any) -> None:
        key = (id(batch), dynamics.context.version)
        if self._atom_key == key:
            return
        sys = self.systems(batch, dynamics)
        if sys is None:
            self._atoms = self._outside = None
        else:
            self._atoms = sys.index_select(0, batch.batch_idx)
            self._outside = (~self._atoms).unsqueeze(-1)
        self._atom_key = key
