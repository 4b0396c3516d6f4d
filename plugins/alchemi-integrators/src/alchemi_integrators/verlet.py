"""Velocity Verlet: the NVE integrator (``integrator:velocity-verlet``).

One step of length dt, with the model's forward between the two halves::

    v += dt/2 F/m;  x += dt v        (pre_update)
    F = model(x)
    v += dt/2 F/m                    (post_update)

Symplectic and time-reversible: the total energy fluctuates at order dt² and does not drift.
Total momentum is conserved when the forces sum to zero, so COM motion removed at the start
stays removed (``temperature(batch)`` then counts 3N - 3 degrees of freedom).

Example:
    >>> from alchemi_core import registry
    >>> nve = registry.build("integrator:velocity-verlet", model=model, dt=5.0, n_steps=1000,
    ...                      initial_temperature=50.0, random_seed=0)  # doctest: +SKIP
    >>> nve.run(batch)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from alchemi_integrators import warp_kernels
from alchemi_integrators.base import MDIntegrator
from alchemi_integrators.parameters import ParameterValue

if TYPE_CHECKING:
    from alchemi_core.data import Batch


class VelocityVerlet(MDIntegrator):
    """Microcanonical (NVE) velocity Verlet (see the module docstring).

    Args:
        model: Returns ``energy`` ``[B, 1]`` and ``forces`` ``[V, 3]``.
        n_steps: Steps of ``run()``.
        dt: Time step in fs (number, ``[B]`` tensor or system field name).
        **kwargs: ``initial_temperature``, ``random_seed`` (see ``MDIntegrator``) and
            ``BaseDynamics``'s ``hooks``, ``convergence_hook``, ``sampler``,
            ``refill_frequency``, ``sinks``, ``comm_mode``, ``buffer_config``, ``name``.
    """

    #: Keeps each system's centre of mass at rest (loggers count 3N - 3 degrees of freedom).
    conserves_momentum = True

    def __init__(self, model: Any, n_steps: int = 1000, dt: ParameterValue = 1.0, **kwargs: Any) -> None:
        super().__init__(model, n_steps=n_steps, dt=dt, **kwargs)

    def conserved_energy(self, batch: Batch) -> torch.Tensor:
        """``[B]`` total energy ``KE + E_pot`` (eV), which NVE conserves up to O(dt²) fluctuations."""
        from alchemi_integrators.thermo import kinetic_energy

        return kinetic_energy(batch) + batch.energy.view(-1)

    def pre_update(self, batch: Batch) -> None:
        warp_kernels.verlet_pre(self, batch)

    def post_update(self, batch: Batch) -> None:
        warp_kernels.verlet_post(self, batch)
