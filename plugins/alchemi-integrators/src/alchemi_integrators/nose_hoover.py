"""Nose-Hoover chains (``integrator:nose-hoover``): deterministic NVT with a conserved energy.

Each system couples to a chain of M thermostats (Martyna, Klein & Tuckerman 1992) with positions
xi_j, velocities v_j (1/fs) and masses ``Q_1 = N_f kB T tau²``, ``Q_j = kB T tau²`` (eV fs²),
where N_f is the system's degrees of freedom (3N - 3: COM motion must be removed and stays
removed, as :func:`~alchemi_integrators.thermo.initialize_velocities` does by default) and
``tau`` the thermostat period in fs. The step is the Trotter splitting of Martyna, Tuckerman,
Tobias & Klein (1996)::

    NHC(dt/2); velocity Verlet half-kick, drift      (pre_update)
    F = model(x)
    half-kick; NHC(dt/2)                              (post_update)

where NHC(dt/2) integrates the thermostat variables and scales the particle velocities, split
into ``chain_steps`` x Suzuki-Yoshida sub-steps (``yoshida_order`` 1, 3 or 5) for accuracy when
tau is not much longer than dt. The extended energy

    H = KE + E_pot + sum_j Q_j v_j² / 2 + N_f kB T xi_1 + kB T sum_{j>1} xi_j

is conserved (up to the integrator's O(dt²) fluctuation); :meth:`NoseHooverChain.conserved_energy`
returns it per system.

Example:
    >>> from alchemi_core import registry
    >>> nhc = registry.build("integrator:nose-hoover", model=model, dt=5.0, temperature=50.0,
    ...                      tau=500.0, n_steps=1000)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from alchemi_core.errors import ConfigurationError
from alchemi_core.units import KB
from alchemi_integrators.base import MDIntegrator
from alchemi_integrators.parameters import ParameterValue
from alchemi_integrators.thermo import degrees_of_freedom, kinetic_energy
from alchemi_integrators.verlet import kick, kick_and_drift

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: Thermostat positions xi ``[B, M]`` and velocities ``[B, M]`` (1/fs), system-level fields.
CHAIN_POSITIONS = "nhc_positions"
CHAIN_VELOCITIES = "nhc_velocities"

#: Suzuki-Yoshida weights by order (they sum to 1; the 3rd and 5th orders take negative steps).
_W3 = 1.0 / (2.0 - 2.0 ** (1.0 / 3.0))
_W5 = 1.0 / (4.0 - 4.0 ** (1.0 / 3.0))
YOSHIDA_WEIGHTS: dict[int, tuple[float, ...]] = {
    1: (1.0,),
    3: (_W3, 1.0 - 2.0 * _W3, _W3),
    5: (_W5, _W5, 1.0 - 4.0 * _W5, _W5, _W5),
}


class NoseHooverChain(MDIntegrator):
    """Nose-Hoover chain thermostat (see the module docstring).

    Args:
        model: Returns ``energy`` ``[B, 1]`` and ``forces`` ``[V, 3]``.
        n_steps: Steps of ``run()``.
        dt: Time step in fs.
        temperature: Target temperature in K (> 0).
        tau: Thermostat period in fs (> 0); 50-100 dt is typical.
        chain_length: Thermostats per chain, M >= 1 (1 is plain Nose-Hoover).
        chain_steps: Sub-steps n_c of each thermostat half-step.
        yoshida_order: Suzuki-Yoshida order of each sub-step: 1, 3 or 5.
        **kwargs: ``initial_temperature``, ``random_seed``, ``backend`` and ``BaseDynamics``'s
            arguments.

    Raises:
        ConfigurationError: A chain length, sub-step count or order that cannot work.
    """

    #: Keeps each system's centre of mass at rest (loggers count 3N - 3 degrees of freedom).
    conserves_momentum = True

    cpu_backend = "warp"
    #: The thermostat state fields, positions then velocities (the Warp kernels read them by name).
    chain_fields = (CHAIN_POSITIONS, CHAIN_VELOCITIES)

    def __init__(
        self,
        model: Any,
        n_steps: int = 1000,
        dt: ParameterValue = 1.0,
        temperature: ParameterValue = 300.0,
        tau: ParameterValue = 100.0,
        *,
        chain_length: int = 3,
        chain_steps: int = 1,
        yoshida_order: int = 3,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, n_steps=n_steps, dt=dt, **kwargs)
        self.declare("temperature", temperature, unit="K", low=0.0, low_open=True)
        self.declare("tau", tau, unit="fs", low=0.0, low_open=True)
        if int(chain_length) < 1:
            raise ConfigurationError(f"chain_length must be >= 1, got {chain_length}")
        if int(chain_steps) < 1:
            raise ConfigurationError(f"chain_steps must be >= 1, got {chain_steps}")
        if int(yoshida_order) not in YOSHIDA_WEIGHTS:
            raise ConfigurationError(f"yoshida_order must be one of {sorted(YOSHIDA_WEIGHTS)}, got {yoshida_order}")
        self.chain_length = int(chain_length)
        self.chain_steps = int(chain_steps)
        self.yoshida_order = int(yoshida_order)

    # ------------------------------------------------------------------ state
    def create_state(self, batch: Batch) -> None:
        dtype = batch.positions.dtype
        for name in (CHAIN_POSITIONS, CHAIN_VELOCITIES):
            self.ensure_field(batch, name, (self.chain_length,), dtype, "system")

    def init_state(self, batch: Batch, entering: torch.Tensor) -> None:
        super().init_state(batch, entering)
        rows = entering.unsqueeze(-1)
        for name in (CHAIN_POSITIONS, CHAIN_VELOCITIES):
            getattr(batch, name).masked_fill_(rows, 0.0)

    # ------------------------------------------------------------------ physics
    def yoshida_weights(self) -> tuple[float, ...]:
        """The Suzuki-Yoshida weights of this integrator's order (they sum to 1)."""
        return YOSHIDA_WEIGHTS[self.yoshida_order]

    def chain_masses(self, batch: Batch) -> torch.Tensor:
        """``[B, M]`` thermostat masses: ``Q_1 = N_f kB T tau²``, ``Q_j = kB T tau²`` (eV fs²)."""
        kt = self.per_system("temperature", batch) * KB
        tau = self.per_system("tau", batch)
        q = (kt * tau * tau).unsqueeze(-1).repeat(1, self.chain_length)
        q[:, 0] *= degrees_of_freedom(batch)
        return q

    def conserved_energy(self, batch: Batch) -> torch.Tensor:
        """``[B]`` extended energy ``KE + E_pot + thermostat kinetic + potential`` (eV).

        Its change over a run measures the integration error; it needs ``batch.energy`` of the
        current positions (true after any step).
        """
        kt = self.per_system("temperature", batch) * KB
        xi, vxi = getattr(batch, CHAIN_POSITIONS), getattr(batch, CHAIN_VELOCITIES)
        q = self.chain_masses(batch)
        thermostat_ke = 0.5 * (q * vxi * vxi).sum(-1)
        thermostat_pe = kt * (degrees_of_freedom(batch) * xi[:, 0] + xi[:, 1:].sum(-1))
        return kinetic_energy(batch) + batch.energy.view(-1) + thermostat_ke + thermostat_pe

    def _half_step_chain(self, batch: Batch) -> torch.Tensor:
        """Advance the chains by dt/2 and return ``[B]`` factors to scale velocities by."""
        dt = self.per_system("dt", batch)
        active = self.active(batch)
        half = 0.5 * dt if active is None else 0.5 * dt * active  # 0: the chain stays put
        kt = self.per_system("temperature", batch) * KB
        return nhc_half_step(
            kinetic_energy(batch),
            getattr(batch, CHAIN_POSITIONS),
            getattr(batch, CHAIN_VELOCITIES),
            self.chain_masses(batch),
            kt,
            degrees_of_freedom(batch),
            half,
            YOSHIDA_WEIGHTS[self.yoshida_order],
            self.chain_steps,
        )

    def _scale_velocities(self, batch: Batch, scale: torch.Tensor) -> None:
        batch.velocities.mul_(self.to_atoms(batch, scale.unsqueeze(-1), "nhc_scale"))

    def torch_pre_update(self, batch: Batch) -> None:
        self._scale_velocities(batch, self._half_step_chain(batch))
        kick_and_drift(self, batch)

    def torch_post_update(self, batch: Batch) -> None:
        kick(self, batch)
        self._scale_velocities(batch, self._half_step_chain(batch))

    def warp_pre_update(self, batch: Batch) -> None:
        self.warp_kernels.nose_hoover_pre(self, batch)

    def warp_post_update(self, batch: Batch) -> None:
        self.warp_kernels.nose_hoover_post(self, batch)


def nhc_half_step(
    ke: torch.Tensor,
    xi: torch.Tensor,
    vxi: torch.Tensor,
    q: torch.Tensor,
    kt: torch.Tensor,
    nf: torch.Tensor,
    half_dt: torch.Tensor,
    weights: tuple[float, ...],
    chain_steps: int,
) -> torch.Tensor:
    """Integrate ``[B, M]`` chains over ``half_dt`` ``[B]`` in place; return the velocity scale.

    Each sub-step of length h (``w half_dt / chain_steps``) is the symmetric Trotter factorisation
    of MTK 1996: the last thermostat's velocity gets h/2 of its force, each lower one is scaled
    by exp(-h/4 v_{j+1}), kicked by h/2 of its force and scaled again, the particle velocities are
    scaled by exp(-h v_1), the positions move by h v_j, and the same updates run back up the chain.
    The kinetic energy is updated through the scale factor, so no reduction over atoms is needed.
    """
    m = xi.shape[1]
    scale = torch.ones_like(ke)
    ke = ke.clone()

    def force(j: int) -> torch.Tensor:
        if j == 0:
            return (2.0 * ke - nf * kt) / q[:, 0]
        return (q[:, j - 1] * vxi[:, j - 1] ** 2 - kt) / q[:, j]

    def kick(j: int, h: torch.Tensor) -> None:
        if j + 1 < m:
            damp = torch.exp(-0.25 * h * vxi[:, j + 1])
            vxi[:, j] *= damp
            vxi[:, j] += 0.5 * h * force(j)
            vxi[:, j] *= damp
        else:
            vxi[:, j] += 0.5 * h * force(j)

    for _ in range(chain_steps):
        for w in weights:
            h = half_dt * (w / chain_steps)
            for j in reversed(range(m)):
                kick(j, h)
            s = torch.exp(-h * vxi[:, 0])
            scale *= s
            ke *= s * s
            xi += h.unsqueeze(-1) * vxi
            for j in range(m):
                kick(j, h)
    return scale
