"""``DemoDynamics``: velocity Verlet, the reference integrator for tests and examples.

Example:
    >>> import torch
    >>> from alchemi_core.data import AtomicData, Batch
    >>> from alchemi_core.dynamics import DemoDynamics
    >>> from alchemi_core.models.demo import DemoModelWrapper
    >>> batch = Batch.from_data_list([AtomicData(atomic_numbers=torch.tensor([6, 8]),
    ...                                          positions=torch.tensor([[0., 0, 0], [1.3, 0, 0]]))])
    >>> result = DemoDynamics(model=DemoModelWrapper(), n_steps=10, dt=0.5).run(batch)
    >>> result.positions.shape
    torch.Size([2, 3])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.dynamics.base import BaseDynamics

if TYPE_CHECKING:
    from alchemi_core.data import Batch


class DemoDynamics(BaseDynamics):
    """NVE velocity Verlet: half-kick and drift before the forward, half-kick after."""

    def pre_update(self, batch: Batch) -> None:
        # One fused operation per update: the weighted inverse mass is zero for atoms of other
        # stages, so their velocities stay; the drift is masked explicitly for the same reason.
        ctx = self.context
        v = batch.velocities
        v.addcmul_(batch.forces, ctx.weighted_inv_mass, value=0.5 * self.dt)
        w = ctx.node_weight
        if w is None:
            batch.positions.add_(v, alpha=self.dt)
        else:
            batch.positions.addcmul_(v, w, value=self.dt)

    def post_update(self, batch: Batch) -> None:
        batch.velocities.addcmul_(batch.forces, self.context.weighted_inv_mass, value=0.5 * self.dt)
