"""Stochastic velocity rescaling (``integrator:csvr``): the canonical-sampling thermostat of
Bussi, Donadio & Parrinello (J. Chem. Phys. 126, 014101 (2007)) around velocity Verlet.

One step of length dt, the model's forward between the halves::

    v += dt/2 F/m;  x += dt v                                  (pre_update)
    F = model(x)
    v += dt/2 F/m;  v *= alpha                                 (post_update)

Once per step each system's kinetic energy K jumps to an exact sample of its canonical
relaxation towards ``K_0 = N_f kB T / 2`` over dt (the formula of their appendix)::

    alpha² = c + (1 - c) K_0 / (N_f K) (R_1² + S) + 2 R_1 sqrt(c (1 - c) K_0 / (N_f K)),
    c = exp(-dt / tau),

with ``R_1`` a standard normal, ``S`` the sum of ``N_f - 1`` more squared normals and the sign
of alpha that of ``R_1 + sqrt(c N_f K / ((1 - c) K_0))``. ``N_f`` is the system's degrees of
freedom as :func:`~alchemi_integrators.thermo.degrees_of_freedom` counts them (3N - 3: a
scalar rescaling keeps the centre of mass at rest, so COM motion removed at the start stays
removed; fewer under ``FixAtoms``/``FixCartesian``). ``S`` is drawn exactly as twice a
Gamma((N_f - 1) / 2) number (Marsaglia & Tsang's method, boosted below shape 1;
:func:`~alchemi_integrators.kernel_funcs.gamma_variate`): one draw per system whatever its size,
on the device, with no host synchronisation. ``tau`` (fs) is the thermostat's relaxation time:
``tau -> 0`` draws a fresh canonical kinetic energy every step, a large ``tau`` approaches NVE.
The configurational and kinetic distributions are canonical; dynamical properties are perturbed
little for ``tau`` of ~100 dt and above.

The kinetic energy the thermostat takes out accumulates per system in ``csvr_thermostat_energy``,
so the effective energy ``KE + E_pot + that`` (:meth:`CSVR.conserved_energy`) is conserved up to
the integrator's O(dt²) error: its drift measures the integration's accuracy, as NVE's does.

Random numbers come from a counter-based generator keyed by (``random_seed``, ``system_id``,
the system's step count ``csvr_noise_step``), as Langevin's: a system's noise does not depend on
which systems share its batch, and a checkpoint needs no generator state.

Example:
    >>> from alchemi_core import registry
    >>> nvt = registry.build("integrator:csvr", model=model, dt=5.0, temperature=50.0, tau=100.0,
    ...                      n_steps=1000)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from alchemi_integrators import warp_kernels
from alchemi_integrators.base import MDIntegrator
from alchemi_integrators.parameters import ParameterValue
from alchemi_integrators.thermo import kinetic_energy

if TYPE_CHECKING:
    from alchemi_core.data import Batch

#: Per-system count of CSVR steps taken (keys the noise); never reset, like Langevin's.
NOISE_COUNTER = "csvr_noise_step"
#: Per-system kinetic energy the thermostat has taken out (eV), for the conserved energy.
THERMOSTAT_ENERGY = "csvr_thermostat_energy"


class CSVR(MDIntegrator):
    """Canonical sampling through velocity rescaling (see the module docstring).

    Args:
        model: Returns ``energy`` ``[B, 1]`` and ``forces`` ``[V, 3]``.
        n_steps: Steps of ``run()``.
        dt: Time step in fs.
        temperature: Bath temperature in K (> 0).
        tau: Relaxation time of the kinetic energy in fs (> 0); ~100 dt keeps the dynamics
            close to NVE's, a few dt thermalises fast.
        **kwargs: ``initial_temperature``, ``random_seed`` and ``BaseDynamics``'s
            arguments (``hooks``, ``convergence_hook``, ``sampler``, ``sinks``, ...).

    Every parameter is a number, a ``[B]`` tensor or a system field name
    (see :mod:`alchemi_integrators.parameters`).
    """

    #: Keeps each system's centre of mass at rest (loggers count 3N - 3 degrees of freedom).
    conserves_momentum = True

    #: The system fields counting each system's draws and the thermostat's energy (the Warp
    #: kernels read them by name).
    noise_field = NOISE_COUNTER
    heat_field = THERMOSTAT_ENERGY

    def __init__(
        self,
        model: Any,
        n_steps: int = 1000,
        dt: ParameterValue = 1.0,
        temperature: ParameterValue = 300.0,
        tau: ParameterValue = 100.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, n_steps=n_steps, dt=dt, **kwargs)
        self.declare("temperature", temperature, unit="K", low=0.0, low_open=True)
        self.declare("tau", tau, unit="fs", low=0.0, low_open=True)

    def create_state(self, batch: Batch) -> None:
        self.ensure_field(batch, NOISE_COUNTER, (), torch.int32, "system")
        self.ensure_field(batch, THERMOSTAT_ENERGY, (), batch.positions.dtype, "system")

    def init_state(self, batch: Batch, entering: torch.Tensor) -> None:
        super().init_state(batch, entering)
        getattr(batch, THERMOSTAT_ENERGY).masked_fill_(entering, 0.0)

    def conserved_energy(self, batch: Batch) -> torch.Tensor:
        """``[B]`` effective energy ``KE + E_pot + (energy the thermostat took out)`` (eV).

        Conserved up to the integrator's O(dt²) fluctuation (Bussi et al.'s effective energy);
        it needs ``batch.energy`` of the current positions (true after any step).
        """
        return kinetic_energy(batch) + batch.energy.view(-1) + getattr(batch, THERMOSTAT_ENERGY)

    def pre_update(self, batch: Batch) -> None:
        warp_kernels.verlet_pre(self, batch)

    def post_update(self, batch: Batch) -> None:
        warp_kernels.csvr_post(self, batch)
