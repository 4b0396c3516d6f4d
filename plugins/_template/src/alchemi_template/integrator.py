"""A symplectic Euler integrator: first-order, time-reversible only in the limit, but symplectic.

Example:
    >>> from alchemi_core import registry
    >>> integrator = registry.build("integrator:template-euler", model=model, n_steps=100, dt=0.5)
"""

from __future__ import annotations

from alchemi_core.data import Batch
from alchemi_core.dynamics import BaseDynamics


class SymplecticEuler(BaseDynamics):
    """v += dt F/m, then x += dt v, using the forces of the previous step.

    The model forward runs between ``pre_update`` and ``post_update``; this integrator does all
    its work before it, so the forces it uses are from the end of the previous step.

    Everything it needs comes from ``self.context`` (a ``StepContext``): ``weighted_inv_mass``
    is zero for atoms this stage does not own, so the kick leaves them alone, and
    ``node_weight`` masks the drift the same way (None: every atom is this stage's). Both
    updates work in place on the batch's own tensors, so a step allocates nothing and can be
    captured as a CUDA graph.
    """

    def pre_update(self, batch: Batch) -> None:
        ctx = self.context
        assert ctx.weighted_inv_mass is not None  # the engine sets it before the first step
        batch.velocities.addcmul_(batch.forces, ctx.weighted_inv_mass, value=self.dt)
        if ctx.node_weight is None:
            batch.positions.add_(batch.velocities, alpha=self.dt)
        else:
            batch.positions.addcmul_(batch.velocities, ctx.node_weight, value=self.dt)

    def post_update(self, batch: Batch) -> None:
        return None
