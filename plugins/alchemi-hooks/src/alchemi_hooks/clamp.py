"""``MaxForceClampHook``: cap every atom's force norm, keeping its direction.

A safety net for rough starting structures: forces above ``max_force`` are scaled down to it on
the device after the model forward; forces below it are untouched, bit for bit. Forces the
engine computes outside a step (run start, refills, systems entering the stage) are clamped
before the integrator's first use of them.

Example:
    >>> import torch
    >>> from alchemi_core.dynamics import DemoDynamics
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> from alchemi_hooks.clamp import MaxForceClampHook
    >>> md = DemoDynamics(model=DemoModelWrapper(), n_steps=10, dt=0.5,
    ...                   hooks=[MaxForceClampHook(max_force=10.0)])
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from alchemi_core.dynamics.hook import Hook
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.errors import ConfigurationError
from alchemi_core.workspace import Workspace
from alchemi_hooks.parts import HookPart
from alchemi_hooks.scope import Scope

if TYPE_CHECKING:
    from alchemi_core.data import Batch


class MaxForceClampHook(Hook):
    """Scale each atom's force so its norm is at most ``max_force`` (eV/Å).

    Args:
        max_force: The cap in eV/Å, positive and finite.
        frequency: Clamp on every N-th step (1: every step, what a safety net needs).

    Raises:
        ConfigurationError: ``max_force`` is not a positive finite number.
    """

    stage = DynamicsStage.AFTER_COMPUTE

    def __init__(self, max_force: float, frequency: int = 1) -> None:
        super().__init__(frequency=frequency)
        cap = float(max_force)
        if not (cap > 0 and math.isfinite(cap)):
            raise ConfigurationError(
                f"MaxForceClampHook: max_force must be a positive number of eV/Å, got {max_force!r}"
            )
        self.max_force = cap
        self._scope = Scope()
        self._work = Workspace()
        self._seen: Any = None  # (batch, version, stage mask) whose forces are clamped
        self.parts = (
            HookPart(DynamicsStage.BEFORE_PRE_UPDATE, self._clamp_new),
            HookPart(DynamicsStage.AFTER_COMPUTE, self.__call__, frequency=self.frequency),
        )

    def on_run_start(self, batch: Batch, dynamics: Any) -> None:
        self._seen = None
        self._clamp_new(batch, dynamics)

    def _clamp_new(self, batch: Batch, dynamics: Any) -> None:
        """Clamp forces computed outside a step: a new run, new systems or a new stage mask."""
        systems = self._scope.systems(batch, dynamics)
        seen = self._seen
        if seen is not None and seen[0] is batch and seen[1] == batch.version and seen[2] is systems:
            return
        self(batch, dynamics)
        self._seen = (batch, batch.version, systems)

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        forces = batch.forces
        n = forces.shape[0]
        scale = self._work.get("scale", n, n, (1,), forces.dtype, forces.device)
        torch.linalg.vector_norm(forces, dim=-1, keepdim=True, out=scale)
        # factor = cap / max(|F|, cap): 1 below the cap (and for zero forces), cap/|F| above it.
        scale.clamp_(min=self.max_force).reciprocal_().mul_(self.max_force)
        outside = self._scope.atoms_outside(batch, dynamics)
        if outside is not None:
            scale.masked_fill_(outside, 1.0)
        forces.mul_(scale)

    def __repr__(self) -> str:
        return f"MaxForceClampHook(max_force={self.max_force}, frequency={self.frequency})"

