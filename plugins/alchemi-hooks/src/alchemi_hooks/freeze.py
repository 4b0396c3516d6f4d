"""``FreezeAtomsHook``: keep chosen atoms fixed in place (a slab's bottom layers, anchors).

Frozen atoms are those with the bool atom field ``frozen`` set; ``indices`` or ``mask`` (atoms of
the batch the run starts with, like ASE's ``FixAtoms``) are added to that field when a run
starts, so the choice travels with each system. The engine keeps atoms marked ``frozen`` from
moving (``alchemi_core.dynamics.constraints``); the hook marks them, zeroes their velocities
when systems enter, and zeroes their forces after each model forward, so ``fmax``, logs and
optimisers see only the atoms that move, as in ASE.

Example:
    >>> from alchemi_core.dynamics import DemoDynamics
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> from alchemi_hooks.freeze import FreezeAtomsHook
    >>> md = DemoDynamics(model=DemoModelWrapper(), n_steps=100, dt=0.5,
    ...                   hooks=[FreezeAtomsHook(indices=[0, 1])])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from alchemi_core.dynamics.hook import Hook
from alchemi_core.dynamics.stage import DynamicsStage
from alchemi_core.errors import ConfigurationError, InvalidDataError
from alchemi_hooks.parts import HookPart
from alchemi_hooks.scope import Scope

if TYPE_CHECKING:
    from alchemi_core.data import Batch

FIELD = "frozen"


class FreezeAtomsHook(Hook):
    """Hold atoms marked ``frozen`` (plus ``indices``/``mask``) fixed (see the module docstring).

    Args:
        indices: Atom indices in the batch the run starts with.
        mask: ``[V]`` bool, True for atoms to freeze, over the batch the run starts with.

    Raises:
        ConfigurationError: Both ``indices`` and ``mask``; at run start, indices out of range, a
            mask of the wrong length, or nothing to freeze (no ``frozen`` field and no selection).
    """

    stage = DynamicsStage.BEFORE_PRE_UPDATE

    def __init__(
        self,
        indices: Sequence[int] | torch.Tensor | None = None,
        mask: Sequence[bool] | torch.Tensor | None = None,
    ) -> None:
        super().__init__(frequency=1)
        if indices is not None and mask is not None:
            raise ConfigurationError("FreezeAtomsHook takes indices or mask, not both")
        self.indices = None if indices is None else torch.as_tensor(indices, dtype=torch.long).reshape(-1)
        self.mask = None if mask is None else torch.as_tensor(mask, dtype=torch.bool).reshape(-1)
        self.parts = (
            HookPart(DynamicsStage.BEFORE_PRE_UPDATE, self.hold),
            HookPart(DynamicsStage.AFTER_COMPUTE, self.zero_forces),
        )
        self._scope = Scope()
        self._free_key: Any = None
        self._free: torch.Tensor | None = None
        self._held_version: Any = None

    def on_run_start(self, batch: Batch, dynamics: Any) -> None:
        self._mark(batch)
        self._free_key = None
        self._held_version = None
        self.hold(batch, dynamics)
        self.zero_forces(batch, dynamics)

    def _mark(self, batch: Batch) -> None:
        """Write ``indices``/``mask`` into the batch's ``frozen`` field."""
        n = batch.num_nodes
        if self.indices is None and self.mask is None:
            if FIELD not in batch:
                raise ConfigurationError(
                    "FreezeAtomsHook has nothing to freeze: the batch has no bool atom field 'frozen' and "
                    "no indices= or mask= was given"
                )
            return
        if self.mask is not None:
            if self.mask.numel() != n:
                raise ConfigurationError(
                    f"FreezeAtomsHook: mask has {self.mask.numel()} entries but the batch has {n} atoms"
                )
            chosen = self.mask.to(batch.device)
        else:
            assert self.indices is not None
            if self.indices.numel() and (int(self.indices.min()) < -n or int(self.indices.max()) >= n):
                raise ConfigurationError(
                    f"FreezeAtomsHook: indices {self.indices.tolist()[:10]} go beyond the batch's {n} atoms"
                )
            chosen = torch.zeros(n, dtype=torch.bool, device=batch.device)
            chosen[self.indices.to(batch.device)] = True
        if FIELD in batch:
            batch.set_field(FIELD, batch.frozen.to(torch.bool).reshape(-1) | chosen, "node")
        else:
            batch.set_field(FIELD, chosen, "node")

    def free_weight(self, batch: Batch, dynamics: Any) -> torch.Tensor:
        """``[V, 1]`` 0.0 for frozen atoms of the hook's systems, 1.0 elsewhere (cached)."""
        atoms = self._scope.atoms(batch, dynamics)
        key = self._free_key
        if key is None or key[0] is not atoms or key[1] is not batch or key[2] != batch.version:
            if FIELD not in batch:
                raise InvalidDataError(
                    "FreezeAtomsHook: the batch lost its 'frozen' field (systems that enter later must "
                    "carry it too; mark them frozen=False where nothing is held)"
                )
            hold = batch.frozen.reshape(-1).to(torch.bool)
            if atoms is not None:
                hold = hold & atoms
            self._free = (~hold).to(batch.positions.dtype).unsqueeze(-1)
            self._free_key = (atoms, batch, batch.version)
        assert self._free is not None
        return self._free

    def hold(self, batch: Batch, dynamics: Any) -> None:
        """Zero the velocities of frozen atoms when systems entered since the last call."""
        key = (id(batch), batch.version)
        if key == self._held_version:
            return
        batch.velocities.mul_(self.free_weight(batch, dynamics))
        self._held_version = key

    def zero_forces(self, batch: Batch, dynamics: Any) -> None:
        """Zero the forces on frozen atoms after the model forward."""
        batch.forces.mul_(self.free_weight(batch, dynamics))

    def __call__(self, batch: Batch, dynamics: Any) -> None:
        """Both points at once (for calling the hook by hand)."""
        self.hold(batch, dynamics)
        self.zero_forces(batch, dynamics)

    def __repr__(self) -> str:
        chosen = "field 'frozen'"
        if self.indices is not None:
            chosen = f"indices {self.indices.tolist()[:10]}"
        elif self.mask is not None:
            chosen = f"mask of {self.mask.numel()} atoms"
        return f"FreezeAtomsHook({chosen})"
