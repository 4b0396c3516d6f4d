"""Which systems and atoms a hook acts on.

Inside a stage the engine sets ``dynamics.system_mask`` (``[B]`` bool, None for all) to the
systems that stage integrates; a hook must act on those only, so the same hook class works in a
single stage, in each sub-stage of a ``FusedStage`` and while inflight refill changes the batch.
A hook given to a ``FusedStage`` itself acts on the systems of any of its sub-stages (not the
graduated ones that wait in the batch). The engine rewrites its masks in place, only at check
steps, and bumps ``dynamics.mask_version`` when it does; the views derived here are cached on
that counter and ``batch.version``, so on other steps they cost nothing.

Example:
    >>> import torch
    >>> from types import SimpleNamespace
    >>> from alchemi_core.testing import make_batch
    >>> from alchemi_hooks.scope import Scope
    >>> batch = make_batch([2, 3])
    >>> stage = SimpleNamespace(system_mask=torch.tensor([False, True]))
    >>> Scope().atoms(batch, stage).tolist()
    [False, False, True, True, True]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from alchemi_core.data import Batch


def stage_system_mask(dynamics: Any) -> torch.Tensor | None | tuple[torch.Tensor | None, ...]:
    """The engine's mask for ``dynamics``; for a fused stage, the tuple of its sub-stages' masks."""
    if hasattr(dynamics, "system_mask"):
        return dynamics.system_mask
    stages = getattr(dynamics, "stages", None)
    if stages:
        return tuple(getattr(s, "system_mask", None) for s in stages)
    return None


def mask_key(dynamics: Any, batch: Batch) -> tuple[Any, ...]:
    """Changes whenever the masks of ``dynamics`` (or of a fused stage's sub-stages) may have."""
    stages = getattr(dynamics, "stages", None) if not hasattr(dynamics, "system_mask") else None
    stages = stages or [dynamics]
    return (id(batch), batch.version, *(getattr(s, "mask_version", None) for s in stages))


class Scope:
    """Per-hook cache of the systems (``[B]`` bool) and atoms (``[V]`` bool) of its stage."""

    def __init__(self) -> None:
        self._sys_key: Any = None
        self._sys: torch.Tensor | None = None
        self._atom_key: Any = None
        self._atoms: torch.Tensor | None = None
        self._outside: torch.Tensor | None = None

    def systems(self, batch: Batch, dynamics: Any) -> torch.Tensor | None:
        """``[B]`` bool, True for the systems the hook acts on; None means every system."""
        raw = stage_system_mask(dynamics)
        if not isinstance(raw, tuple):
            return raw
        masks = [m for m in raw if m is not None]
        if len(masks) != len(raw):
            return None
        key = mask_key(dynamics, batch)
        if self._sys_key != key or self._sys is None:
            combined = masks[0].clone()
            for m in masks[1:]:
                combined |= m
            self._sys, self._sys_key = combined, key
        return self._sys

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
