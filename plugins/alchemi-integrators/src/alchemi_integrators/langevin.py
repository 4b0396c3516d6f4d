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
every path, noise and COM correction included: the engine puts back what a step did to them
(:mod:`alchemi_core.dynamics.constraints`).

Random numbers come from this integrator's generator, seeded by ``random_seed``, on the torch
backend. The Warp backend draws them inside its kernel from a counter-based generator keyed by
(seed, ``system_id``, the system's step count, atom index within the system), so a system's noise
does not depend on which other systems share the batch, and a checkpoint needs no generator
state. It is the default wherever warp-lang is installed, on a CPU too (the same kernels as on a
GPU).

Example:
    >>> from alchemi_core import registry
    >>> nvt = registry.build("integrator:langevin", model=model, dt=5.0, temperature=50.0,
    ...                      friction=0.01, n_steps=1000)  # doctest: +SKIP
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, TypeAlias

import torch

from alchemi_core.units import KB
from alchemi_integrators.base import MDIntegrator
from alchemi_integrators.parameters import ParameterValue
from alchemi_integrators.thermo import masses_and_totals

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: A per-atom ``[V, 1]`` coefficient, or one number for every atom.
Coefficient: TypeAlias = "torch.Tensor | float"

#: Per-system count of Langevin steps taken (keys the Warp backend's noise). It travels with the
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
        **kwargs: ``initial_temperature``, ``random_seed``, ``backend`` and ``BaseDynamics``'s
            arguments (``hooks``, ``convergence_hook``, ``sampler``, ``sinks``, ...).

    Every parameter is a number, a ``[B]`` tensor or a system field name
    (see :mod:`alchemi_integrators.parameters`).
    """

    #: The system field counting each system's noise draws (the Warp kernels read it by name).
    noise_field = NOISE_COUNTER
    #: On a CPU too: the one Warp path, the same kernels as on a GPU.
    cpu_backend = "warp"

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

    def _coefficients(self, batch: Batch) -> tuple[torch.Tensor, Coefficient, Coefficient, torch.Tensor]:
        """Per atom: half-kick ``dt/2 / m``, half-drift ``dt/2``, friction decay ``c1`` and noise
        amplitude ``c2 sqrt(kB T / m)`` (zero for atoms of systems this stage does not move)."""

        def build() -> tuple[torch.Tensor, Coefficient, Coefficient, torch.Tensor]:
            dt, gamma, temp = (self.values(n, batch) for n in ("dt", "friction", "temperature"))
            inv_mass = self.inv_mass
            weight = self.context.node_weight
            if all(isinstance(x, float) for x in (dt, gamma, temp)) and weight is None:
                c1 = math.exp(-gamma * dt)
                # Variance of each velocity component: kB T / m, in (Å/fs)² = kB T * inv_mass.
                sigma = torch.sqrt(inv_mass * (KB * temp)) * math.sqrt(1.0 - c1 * c1)
                return _per_component(inv_mass * (0.5 * dt)), 0.5 * dt, c1, _per_component(sigma)
            per_sys = torch.stack(
                [self.per_system(n, batch) for n in ("dt", "friction", "temperature")], dim=-1
            )
            if self.context.system_mask is not None:
                per_sys = per_sys.clone()
                per_sys[:, 0] *= self.active(batch)  # dt = 0: B, A and O all become the identity
            atom = per_sys.index_select(0, batch.batch_idx)
            dt_a, gamma_a, temp_a = atom[:, 0:1], atom[:, 1:2], atom[:, 2:3]
            c1_a = torch.exp(-gamma_a * dt_a)
            sigma = torch.sqrt((1.0 - c1_a * c1_a) * KB * temp_a * inv_mass)
            return (_per_component(inv_mass * dt_a * 0.5), _per_component(dt_a * 0.5), _per_component(c1_a),
                    _per_component(sigma))

        return self.cached("baoab", batch, build)

    def torch_pre_update(self, batch: Batch) -> None:
        kick, half_dt, c1, sigma = self._coefficients(batch)
        v, x = batch.velocities, batch.positions
        v.addcmul_(batch.forces, kick)
        _drift(x, v, half_dt)
        noise = self.work.get("noise", batch.num_nodes, batch.node_capacity, (3,), v.dtype, v.device)
        noise.normal_(generator=self.generator(v.device))
        noise.mul_(sigma)
        if self.fix_com:
            noise.sub_(self._com_velocity(batch, noise))
        v.mul_(c1).add_(noise)
        _drift(x, v, half_dt)
        counter = getattr(batch, NOISE_COUNTER)
        if self.context.system_mask is None:
            counter.add_(1)
        else:
            counter.add_(self.context.system_mask.to(counter.dtype))

    def _com_velocity(self, batch: Batch, dv: torch.Tensor) -> torch.Tensor:
        """``[V, 3]``: each atom's system's mass-weighted mean of ``dv``."""
        mass, total, flat_index, size = self.cached("mass", batch, lambda: _com_sums(batch, self.inv_mass),
                                                    reads_fields=False, masks=False)
        momentum = self.work.get("momentum", batch.num_graphs, batch.system_capacity, (3,), dv.dtype, dv.device)
        weighted = torch.mul(dv, mass, out=self.work.get("weighted", batch.num_nodes, batch.node_capacity, (3,),
                                                         dv.dtype, dv.device))
        if size:  # systems of one size: a sum over a view
            torch.sum(weighted.view(batch.num_graphs, size, 3), dim=1, out=momentum)
        else:  # one index per component: index_add_ of whole rows of 3 is twice as slow on a CPU
            assert flat_index is not None
            momentum.view(-1).zero_().index_add_(0, flat_index, weighted.view(-1))
        momentum.div_(total)
        return self.to_atoms(batch, momentum, "com_velocity")

    def torch_post_update(self, batch: Batch) -> None:
        kick = self._coefficients(batch)[0]
        batch.velocities.addcmul_(batch.forces, kick)

    def warp_pre_update(self, batch: Batch) -> None:
        self.warp_kernels.langevin_pre(self, batch)

    def warp_post_update(self, batch: Batch) -> None:
        self.warp_kernels.langevin_post(self, batch)


def _per_component(values: torch.Tensor) -> torch.Tensor:
    """``[V, 1]`` values repeated over the 3 components (``[V, 3]``, contiguous): torch on a CPU
    multiplies ``[V, 3]`` by ``[V, 3]`` in one vectorised loop, but by a broadcast ``[V, 1]`` three
    elements at a time. With these and the sums of :func:`_com_sums`, W6's step went from
    2.60-2.66 to 2.48-2.56 ms (``python -m benchmarks --device cpu --workloads W6:108x64``)."""
    return values.expand(-1, 3).contiguous()


def _com_sums(batch: Batch, inv_mass: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
    """What :meth:`Langevin._com_velocity` sums with: masses ``[V, 3]``, totals ``[B, 1]``, the
    systems' common size (0 if they differ) and, only where they differ, each atom's component's
    index into ``[B * 3]``."""
    mass, total = masses_and_totals(batch, inv_mass)
    sizes = batch.num_nodes_per_system
    size = int(sizes[0]) if len(sizes) and (sizes == sizes[0]).all() else 0
    flat_index = None
    if not size:
        flat_index = (batch.batch_idx[:, None] * 3 + torch.arange(3, device=mass.device)).reshape(-1)
    return _per_component(mass), total, flat_index, size


def _drift(x: torch.Tensor, v: torch.Tensor, half_dt: torch.Tensor | float) -> None:
    if isinstance(half_dt, float):
        x.add_(v, alpha=half_dt)
    else:
        x.addcmul_(v, half_dt)
