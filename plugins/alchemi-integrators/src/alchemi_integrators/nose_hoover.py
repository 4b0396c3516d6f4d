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
from alchemi_integrators import warp_kernels
from alchemi_integrators.base import MDIntegrator
from alchemi_integrators.parameters import ParameterValue
from alchemi_integrators.thermo import degrees_of_freedom, kinetic_energy

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
        **kwargs: ``initial_temperature``, ``random_seed`` and ``BaseDynamics``'s
            arguments.

    Raises:
        ConfigurationError: A chain length, sub-step count or order that cannot work.
    """

    #: Keeps each system's centre of mass at rest (loggers count 3N - 3 degrees of freedom).
    conserves_momentum = True

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

    def pre_update(self, batch: Batch) -> None:
        warp_kernels.nose_hoover_pre(self, batch)

    def post_update(self, batch: Batch) -> None:
        warp_kernels.nose_hoover_post(self, batch)
