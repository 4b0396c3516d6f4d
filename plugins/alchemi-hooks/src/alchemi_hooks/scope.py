"""Which systems and atoms a hook acts on.

Inside a stage the engine keeps ``dynamics.context.system_mask`` (``[B]`` bool, None for all)
on the systems that stage integrates; a hook must act on those only, so the same hook class
works in a single stage, in each sub-stage of a ``FusedStage`` and while inflight refill
changes the batch. A hook given to a ``FusedStage`` itself gets the fused stage's context,
which covers the systems of all its sub-stages (not the graduated ones that wait in the batch).
The engine rewrites its masks in place, only at check steps, and gives the context a new
``version`` when it does; the views derived here are cached on that number, so on other steps
they cost nothing.

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


def stage_system_mask(dynamics: Any) -> torch.Tensor | None:
    """The systems of ``dynamics`` (its context's ``system_mask``; None means every system)."""
    mask: torch.Tensor | None = dynamics.context.system_mask
    return mask


def mask_key(dynamics: Any, batch: Batch) -> tuple[int, int]:
    """Changes whenever the masks of ``dynamics`` may have (the context's version)."""
    return (id(batch), dynamics.context.version)


class Scope:
    """Per-hook cache of the systems (``[B]`` bool) and atoms (``[V]`` bool) of its stage."""

    def __init__(self) -> None:
        self._atom_key: Any = None
        self._atoms: torch.Tensor | None = None
        self._outside: torch.Tensor | None = None

    def systems(self, batch: Batch, dynamics: Any) -> torch.Tensor | None:
        """``[B]`` bool, True for the systems the hook acts on; None means every system."""
        return stage_system_mask(dynamics)

    def atoms(self, batch: Batch, dynamics: Any) -> torch.Tensor | None:
        """``[V]`` bool, True for atoms of the systems the hook acts on; None means every atom."""
        self._refresh_atoms(batch, dynamics)
        return self._atoms

    def atoms_outside(self, batch: Batch, dynamics: Any) -> torch.Tensor | None:
        """``[V, 1]`` bool, True for atoms the hook must leave alone; None when it acts on all."""
        self._refresh_atoms(batch, dynamics)
        return self._outside

    def _refresh_atoms(self, batch: Batch, dynamics: Any) -> None:
        key = mask_key(dynamics, batch)
        if self._atom_key == key:
            return
        sys = self.systems(batch, dynamics)
        if sys is None:
            self._atoms = self._outside = None
        else:
            self._atoms = sys.index_select(0, batch.batch_idx)
            self._outside = (~self._atoms).unsqueeze(-1)
        self._atom_key = key
