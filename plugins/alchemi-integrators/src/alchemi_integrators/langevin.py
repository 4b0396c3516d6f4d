"""Langevin dynamics with the BAOAB splitting (``integrator:langevin``): the NVT workhorse.

One step of length dt (Leimkuhler & Matthews, 2013), the model's forward between the halves::

    B: v += dt/2 F/m
    A: x += dt/2 v
    O: v  = c1 v + c2 sqrt(kB T / m) R,   c1 = exp(-friction dt),  c2 = sqrt(1 - c1²),  R ~ N(0, 1)
    A: x += dt/2 v                                    (pre_update)
    F = model(x)
    B: v += dt/2 F/m                                  (post_update)

The O step is the exact solution of the Ornstein-Uhlenbeck process over dt, so the
configurational distribution is sampled with an error of order dt² and the kinetic temperature
is exactly T in the harmonic limit. ``friction`` is the collision rate gamma in 1/fs
(0.01/fs = a 100 fs velocity relaxation time).

With ``fix_com=True`` (the default, as ASE's Langevin) the noise of each system is projected so
it adds no net momentum; the COM then stays at rest and the atoms thermalise 3N - 3 degrees of
freedom (``temperature(batch)``). With ``fix_com=False`` all 3N are thermalised
(``temperature(batch, com_fixed=False)``) and the step does one reduction less. Held atoms and
components (``frozen``, ``frozen_axes``: ASE's ``FixAtoms``, ``FixCartesian``) stay in place on
every step, noise and COM correction included: the engine puts back what a step did to them
(:mod:`alchemi_core.dynamics.constraints`).

The kernel draws its random numbers from a counter-based generator keyed by (``random_seed``,
``system_id``, the system's step count, atom index within the system), so a system's noise does
not depend on which other systems share the batch, and a checkpoint needs no generator state.

Example:
    >>> from alchemi_core import registry
    >>> nvt = registry.build("integrator:langevin", model=model, dt=5.0, temperature=50.0,
    ...                      friction=0.01, n_steps=1000)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from alchemi_integrators import warp_kernels
from alchemi_integrators.base import MDIntegrator
from alchemi_integrators.parameters import ParameterValue

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: Per-system count of Langevin steps taken (keys the noise). It travels with the
#: system and is never reset, so a system never sees the same noise twice: new systems start at
#: 0, and a second run (or a second Langevin stage) continues the count.
NOISE_COUNTER = "langevin_noise_step"


class Langevin(MDIntegrator):
    """BAOAB Langevin thermostat (see the module docstring).

    Args:
        model: Returns ``energy`` ``[B, 1]`` and ``forces`` ``[V, 3]``.
        n_steps: Steps of ``run()``.
        dt: Time step in fs.
        temperature: Bath temperature in K.
        friction: Collision rate in 1/fs (>= 0; 0 gives velocity Verlet).
        fix_com: Keep each system's centre of mass at rest (see the module docstring).
        **kwargs: ``initial_temperature``, ``random_seed`` and ``BaseDynamics``'s
            arguments (``hooks``, ``convergence_hook``, ``sampler``, ``sinks``, ...).

    Every parameter is a number, a ``[B]`` tensor or a system field name
    (see :mod:`alchemi_integrators.parameters`).
    """

    #: The system field counting each system's noise draws (the Warp kernels read it by name).
    noise_field = NOISE_COUNTER

    def __init__(
        self,
        model: Any,
        n_steps: int = 1000,
        dt: ParameterValue = 1.0,
        temperature: ParameterValue = 300.0,
        friction: ParameterValue = 0.01,
        *,
        fix_com: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, n_steps=n_steps, dt=dt, **kwargs)
        self.declare("temperature", temperature, unit="K", low=0.0)
        self.declare("friction", friction, unit="1/fs", low=0.0)
        self.fix_com = bool(fix_com)

    def create_state(self, batch: Batch) -> None:
        self.ensure_field(batch, NOISE_COUNTER, (), torch.int32, "system")

    def pre_update(self, batch: Batch) -> None:
        warp_kernels.langevin_pre(self, batch)

    def post_update(self, batch: Batch) -> None:
        warp_kernels.langevin_post(self, batch)
