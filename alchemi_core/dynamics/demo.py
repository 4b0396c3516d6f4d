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
        v, w = batch.velocities, self.node_weight
        kick = batch.forces * self.inv_mass
        if w is not None:
            kick.mul_(w)
        v.add_(kick, alpha=0.5 * self.dt)
        if w is None:
            batch.positions.add_(v, alpha=self.dt)
        else:
            batch.positions.addcmul_(v, w, value=self.dt)

    def post_update(self, batch: Batch) -> None:
        kick = batch.forces * self.inv_mass
        if self.node_weight is not None:
            kick.mul_(self.node_weight)
        batch.velocities.add_(kick, alpha=0.5 * self.dt)
