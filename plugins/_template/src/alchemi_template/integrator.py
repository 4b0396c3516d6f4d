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
    """

    def pre_update(self, batch: Batch) -> None:
        kick = batch.forces * self.inv_mass * self.dt
        drift_weight = self.node_weight
        if drift_weight is not None:
            kick.mul_(drift_weight)
        batch.velocities.add_(kick)
        if drift_weight is None:
            batch.positions.add_(batch.velocities, alpha=self.dt)
        else:
            batch.positions.addcmul_(batch.velocities, drift_weight, value=self.dt)

    def post_update(self, batch: Batch) -> None:
        return None
