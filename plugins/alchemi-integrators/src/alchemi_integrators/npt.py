"""Constant-pressure molecular dynamics: ``integrator:npt-mtk``, ``integrator:nph`` and
``integrator:npt-crescale``.

Both move each system's cell with its atoms towards a target ``pressure`` (eV/Å³; see
``alchemi_core.units.GPA``) at a target ``temperature`` (K), per system: each is a number, a
``[B]`` tensor or the name of a system-level field, so targets travel with their systems. The
cell is ``batch.cell`` (rows are lattice vectors); the model must return stress (positive under
tension), which both ask for every step. ``anisotropic=False`` keeps the cell's shape and changes
its volume; ``anisotropic=True`` lets all six strain components fluctuate (the cell does not
rotate). The internal pressure tensor is ``P = (sum_i m_i v_i v_i^T) / V - sigma``.

**MTK** (:class:`NPTMTK`; Martyna, Tobias & Klein, J. Chem. Phys. 101, 4177 (1994), integrated as
in Tuckerman et al., J. Phys. A 39, 5629 (2006)). The cell's strain rate ``g`` (a symmetric
``[3, 3]``, 1/fs) has mass ``W = (N_f + 3) kB T tau_p² / 3``; the atoms and the barostat each
couple to a Nose-Hoover chain (``tau_t``, and ``tau_p`` for the barostat's chain). The step is
the Trotter splitting::

    barostat chain, particle chain (dt/2); g += dt/2 G/W; v <- exp(-B dt/2) v + dt/2 phi1(.) F/m
    x <- exp(g dt) x + dt phi1(g dt) v; h <- exp(g dt) h          (pre_update)
    F, sigma = model(x, h)
    v <- exp(-B dt/2) v + ...; g += dt/2 G/W; particle chain, barostat chain (dt/2)   (post_update)

with ``G = sum m v v^T - V sigma - V p I + (2 KE / N_f) I`` (its trace part only when isotropic)
and ``B = g + tr(g)/N_f I``. The matrix exponentials are exact for the strain rates of NPT runs
(``|g dt| << 0.1``). It conserves
``H = KE + E + p V + W |g|² / 2 + (both chains' energies)``: :meth:`NPTMTK.conserved_energy`.

**NPH** (:class:`NPH`, ``integrator:nph``): the same step with both chains removed (no
thermostat on the atoms or the cell); it conserves the enthalpy ``KE + E + p V + W |g|² / 2``
(:meth:`NPTMTK.enthalpy`), and ``temperature`` only sets the barostat mass ``W``.

**C-rescale** (:class:`NPTCRescale`; Bernetti & Bussi, J. Chem. Phys. 153, 114107 (2020)):
stochastic cell rescaling. Each step the log-volume moves by
``d eps = -(beta_T / tau_p)(p - P_int) dt + sqrt(2 kB T beta_T dt / (V tau_p)) R``
(``R`` standard normal, the noise's amplitude taken at the step's start: Ito; the paper's
``kB T / V`` drift term belongs to other conventions, and in Ito form its stationary volume
distribution would carry an extra factor V; anisotropic: the same per strain component, with
``beta_T / 3``), the
positions and cell are scaled by ``exp(d eps / 3)`` and the velocities by its inverse; the
temperature is held by stochastic velocity rescaling (Bussi, Donadio & Parrinello 2007) with
``tau_t``. ``compressibility`` (``beta_T``, Å³/eV) sets how fast the volume relaxes, not where
it goes: an estimate within a factor of a few is fine. The step::

    thermostat (dt/2); v += dt/2 F/m; x += dt/2 v; rescale (dt); x += dt/2 v   (pre_update)
    F, sigma = model(x, h)
    v += dt/2 F/m; thermostat (dt/2)                                            (post_update)

It samples the isothermal-isobaric ensemble exactly in the limit of small dt; it conserves no
energy (it is stochastic), and relaxes the volume without the oscillations of MTK.

Example:
    >>> from alchemi_core import registry, units
    >>> npt = registry.build("integrator:npt-crescale", model=model, dt=5.0, temperature=50.0,
    ...                      pressure=0.0 * units.GPA, n_steps=1000)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from alchemi_core.dynamics.pressure import cell_volume, kinetic_tensor, pressure_tensor
from alchemi_core.errors import ConfigurationError
from alchemi_core.units import BAR, KB
from alchemi_integrators import crescale_kernels, mtk_kernels
from alchemi_integrators.base import MDIntegrator
from alchemi_integrators.nose_hoover import YOSHIDA_WEIGHTS
from alchemi_integrators.npt_common import (
    BAROSTAT_CHAIN_POSITIONS,
    BAROSTAT_CHAIN_VELOCITIES,
    CELL_STRAIN_RATE,
    THERMOSTAT_POSITIONS,
    THERMOSTAT_VELOCITIES,
)
from alchemi_integrators.parameters import ParameterValue
from alchemi_integrators.thermo import degrees_of_freedom, kinetic_energy

if TYPE_CHECKING:
    from alchemi_core.data import Batch



class _NPTBase(MDIntegrator):
    """What both barostats share: targets, cell geometry and the per-atom 3x3 transforms."""

    needs_stress = True
    moves_cell = True

    def __init__(
        self,
        model: Any,
        n_steps: int,
        dt: ParameterValue,
        temperature: ParameterValue,
        pressure: ParameterValue,
        tau_t: ParameterValue,
        tau_p: ParameterValue,
        *,
        anisotropic: bool,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, n_steps=n_steps, dt=dt, **kwargs)
        self.declare("temperature", temperature, unit="K", low=0.0, low_open=True)
        self.declare("pressure", pressure, unit="eV/Å³")
        self.declare("tau_t", tau_t, unit="fs", low=0.0, low_open=True)
        self.declare("tau_p", tau_p, unit="fs", low=0.0, low_open=True)
        self.anisotropic = bool(anisotropic)

    def setup(self, batch: Batch) -> None:
        if "cell" not in batch:
            raise ConfigurationError(f"{self.name}: constant-pressure dynamics needs periodic systems with a cell")
        super().setup(batch)

    # ------------------------------------------------------------------ helpers
    def kt(self, batch: Batch) -> torch.Tensor:
        return self.per_system("temperature", batch) * KB

    @staticmethod
    def volume(batch: Batch) -> torch.Tensor:
        """``[B]`` cell volumes, Å³."""
        return cell_volume(batch)

    @staticmethod
    def kinetic_tensor(batch: Batch) -> torch.Tensor:
        """``[B, 3, 3]`` ``sum_i m_i v_i v_i^T`` in eV (twice the kinetic energy tensor)."""
        return kinetic_tensor(batch)

    @staticmethod
    def pressure_tensor(batch: Batch) -> torch.Tensor:
        """``[B, 3, 3]`` instantaneous pressure ``(sum m v v^T) / V - sigma`` (eV/Å³,
        :func:`alchemi_core.dynamics.pressure.pressure_tensor`)."""
        return pressure_tensor(batch)

    def system_dof(self, batch: Batch) -> torch.Tensor:
        """``[B]`` degrees of freedom ``3N - 3`` (kept while the batch's systems stay the same)."""
        return self.cached("npt_dof", batch, lambda: degrees_of_freedom(batch), reads_fields=False, masks=False)


class NPTMTK(_NPTBase):
    """Martyna-Tobias-Klein NPT with Nose-Hoover chains (see the module docstring).

    Args:
        model: Returns ``energy``, ``forces`` and, asked for it, ``stress``.
        n_steps: Steps of ``run()``.
        dt: Time step in fs.
        temperature: Target temperature in K.
        pressure: Target pressure in eV/Å³ (``1.0 * units.GPA``).
        tau_t: Thermostat period in fs (~100 dt).
        tau_p: Barostat period in fs (~1000 dt): the period of the volume's oscillation.
        anisotropic: All six strain components fluctuate (else only the volume).
        chain_length: Thermostats per chain (particles and barostat).
        chain_steps: Sub-steps of each chain half-step.
        yoshida_order: Suzuki-Yoshida order of the chain sub-steps: 1, 3 or 5.
        **kwargs: ``initial_temperature``, ``random_seed`` and ``BaseDynamics``'s.
    """

    #: Whether the Nose-Hoover chains act on the atoms and the cell (off: :class:`NPH`).
    thermostatted = True

    def __init__(
        self,
        model: Any,
        n_steps: int = 1000,
        dt: ParameterValue = 1.0,
        temperature: ParameterValue = 300.0,
        pressure: ParameterValue = 0.0,
        tau_t: ParameterValue = 100.0,
        tau_p: ParameterValue = 1000.0,
        *,
        anisotropic: bool = False,
        chain_length: int = 3,
        chain_steps: int = 1,
        yoshida_order: int = 3,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, n_steps, dt, temperature, pressure, tau_t, tau_p, anisotropic=anisotropic, **kwargs)
        if int(chain_length) < 1 or int(chain_steps) < 1 or int(yoshida_order) not in YOSHIDA_WEIGHTS:
            raise ConfigurationError(
                f"chain_length and chain_steps must be >= 1 and yoshida_order one of {sorted(YOSHIDA_WEIGHTS)}, "
                f"got {chain_length}, {chain_steps}, {yoshida_order}"
            )
        self.chain_length = int(chain_length)
        self.chain_steps = int(chain_steps)
        self.yoshida_order = int(yoshida_order)
        #: Degrees of freedom of the cell: 6 (symmetric strain) or 1 (volume).
        self.cell_dof = 6.0 if self.anisotropic else 1.0

    # ------------------------------------------------------------------ state
    def create_state(self, batch: Batch) -> None:
        dtype = batch.positions.dtype
        self.ensure_field(batch, CELL_STRAIN_RATE, (3, 3), dtype, "system")
        for name in (THERMOSTAT_POSITIONS, THERMOSTAT_VELOCITIES, BAROSTAT_CHAIN_POSITIONS, BAROSTAT_CHAIN_VELOCITIES):
            self.ensure_field(batch, name, (self.chain_length,), dtype, "system")

    def init_state(self, batch: Batch, entering: torch.Tensor) -> None:
        super().init_state(batch, entering)
        getattr(batch, CELL_STRAIN_RATE).masked_fill_(entering.view(-1, 1, 1), 0.0)
        for name in (THERMOSTAT_POSITIONS, THERMOSTAT_VELOCITIES, BAROSTAT_CHAIN_POSITIONS, BAROSTAT_CHAIN_VELOCITIES):
            getattr(batch, name).masked_fill_(entering.unsqueeze(-1), 0.0)

    # ------------------------------------------------------------------ masses and energies
    def barostat_mass(self, batch: Batch) -> torch.Tensor:
        """``[B]`` ``W = (N_f + 3) kB T tau_p² / 3`` (eV fs²)."""
        tau_p = self.per_system("tau_p", batch)
        return (degrees_of_freedom(batch) + 3.0) * self.kt(batch) * tau_p * tau_p / 3.0

    def _chain_masses(self, batch: Batch, first_dof: torch.Tensor | float, tau: str) -> torch.Tensor:
        t = self.per_system(tau, batch)
        q = (self.kt(batch) * t * t).unsqueeze(-1).repeat(1, self.chain_length)
        q[:, 0] *= first_dof
        return q

    def _barostat_ke(self, batch: Batch) -> torch.Tensor:
        g = getattr(batch, CELL_STRAIN_RATE)
        return 0.5 * self.barostat_mass(batch) * (g * g).sum((1, 2))

    def enthalpy(self, batch: Batch) -> torch.Tensor:
        """``[B]`` ``KE + E + p V + W |g|²/2`` (eV): the enthalpy at the target pressure plus the
        barostat's kinetic energy, MTK's conserved energy without thermostats (NPH's)."""
        total = kinetic_energy(batch) + batch.energy.view(-1) + self.per_system("pressure", batch) * self.volume(batch)
        return total + self._barostat_ke(batch)

    def conserved_energy(self, batch: Batch) -> torch.Tensor:
        """``[B]`` :meth:`enthalpy` plus both chains' kinetic and potential terms (eV)."""
        kt, nf = self.kt(batch), degrees_of_freedom(batch)
        total = self.enthalpy(batch)
        for (xi_name, v_name), dof, tau in (
            ((THERMOSTAT_POSITIONS, THERMOSTAT_VELOCITIES), nf, "tau_t"),
            ((BAROSTAT_CHAIN_POSITIONS, BAROSTAT_CHAIN_VELOCITIES), self.cell_dof, "tau_p"),
        ):
            xi, vxi = getattr(batch, xi_name), getattr(batch, v_name)
            q = self._chain_masses(batch, dof, tau)
            total = total + 0.5 * (q * vxi * vxi).sum(-1) + kt * (dof * xi[:, 0] + xi[:, 1:].sum(-1))
        return total

    def yoshida_weights(self) -> tuple[float, ...]:
        """The Suzuki-Yoshida weights of the chains' sub-steps."""
        return YOSHIDA_WEIGHTS[self.yoshida_order]

    def pre_update(self, batch: Batch) -> None:
        mtk_kernels.mtk_pre(self, batch)

    def post_update(self, batch: Batch) -> None:
        mtk_kernels.mtk_post(self, batch)


class NPH(NPTMTK):
    """Constant enthalpy and pressure: MTK's barostat with no thermostat (see the module docstring).

    The atoms and the cell move by MTK's equations with both Nose-Hoover chains removed, so the
    enthalpy ``KE + E + p V + W |g|²/2`` (:meth:`~NPTMTK.enthalpy`, also
    :meth:`conserved_energy`) is conserved up to the integrator's O(dt²) fluctuation, and the
    temperature drifts to wherever the enthalpy puts it.

    Args:
        model: Returns ``energy``, ``forces`` and, asked for it, ``stress``.
        n_steps: Steps of ``run()``.
        dt: Time step in fs.
        pressure: Target pressure in eV/Å³ (``1.0 * units.GPA``).
        tau_p: Barostat period in fs (~1000 dt).
        temperature: Reference temperature in K of the barostat mass
            ``W = (N_f + 3) kB T tau_p² / 3`` only (no thermostat acts): the run's expected
            temperature keeps the volume's period near ``tau_p``.
        anisotropic: All six strain components fluctuate (else only the volume).
        **kwargs: ``initial_temperature``, ``random_seed`` and ``BaseDynamics``'s.

    Example:
        >>> from alchemi_core import registry, units
        >>> nph = registry.build("integrator:nph", model=model, dt=5.0, pressure=1.0 * units.GPA,
        ...                      tau_p=5000.0, temperature=50.0, initial_temperature=50.0)  # doctest: +SKIP
    """

    thermostatted = False

    def __init__(
        self,
        model: Any,
        n_steps: int = 1000,
        dt: ParameterValue = 1.0,
        pressure: ParameterValue = 0.0,
        tau_p: ParameterValue = 1000.0,
        temperature: ParameterValue = 300.0,
        *,
        anisotropic: bool = False,
        **kwargs: Any,
    ) -> None:
        # The chains keep their (zero) state fields at the smallest size; tau_t is never read.
        super().__init__(model, n_steps, dt, temperature, pressure, tau_p, tau_p, anisotropic=anisotropic,
                         chain_length=1, chain_steps=1, yoshida_order=1, **kwargs)

    def conserved_energy(self, batch: Batch) -> torch.Tensor:
        """``[B]`` the conserved :meth:`~NPTMTK.enthalpy` (eV)."""
        return self.enthalpy(batch)


class NPTCRescale(_NPTBase):
    """Stochastic cell rescaling with stochastic velocity rescaling (see the module docstring).

    Args:
        model: Returns ``energy``, ``forces`` and, asked for it, ``stress``.
        n_steps: Steps of ``run()``.
        dt: Time step in fs.
        temperature: Target temperature in K.
        pressure: Target pressure in eV/Å³ (``1.0 * units.GPA``).
        tau_t: Thermostat relaxation time in fs (~100 dt; shorter is fine, it is a rescaling).
        tau_p: Barostat relaxation time in fs (~100-1000 dt).
        compressibility: ``beta_T`` in Å³/eV (default water's 4.5e-5 per bar, 72 Å³/eV; LJ argon at
            50 K is ~60 Å³/eV).
        anisotropic: All six strain components fluctuate (else only the volume).
        **kwargs: ``initial_temperature``, ``random_seed`` and ``BaseDynamics``'s.
    """

    def __init__(
        self,
        model: Any,
        n_steps: int = 1000,
        dt: ParameterValue = 1.0,
        temperature: ParameterValue = 300.0,
        pressure: ParameterValue = 0.0,
        tau_t: ParameterValue = 100.0,
        tau_p: ParameterValue = 1000.0,
        compressibility: ParameterValue = 4.5e-5 / BAR,
        *,
        anisotropic: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, n_steps, dt, temperature, pressure, tau_t, tau_p, anisotropic=anisotropic, **kwargs)
        self.declare("compressibility", compressibility, unit="Å³/eV", low=0.0, low_open=True)
        self._noise_counters: dict[torch.device, torch.Tensor] = {}

    def noise_counter(self, device: torch.device) -> torch.Tensor:
        """This device's draw counter (a device int32 ``[1]``), which keys the Warp draws."""
        counter = self._noise_counters.get(device)
        if counter is None:
            counter = self._noise_counters[device] = torch.zeros(1, dtype=torch.int32, device=device)
        return counter

    def state_dict(self) -> dict[str, Any]:
        """The random state (see ``MDIntegrator.state_dict``) and the Warp draw counters."""
        state = super().state_dict()
        state["noise_counters"] = {str(d): int(c.item()) for d, c in self._noise_counters.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._noise_counters = {
            torch.device(d): torch.full((1,), int(n), dtype=torch.int32, device=torch.device(d))
            for d, n in state.get("noise_counters", {}).items()
        }

    def pre_update(self, batch: Batch) -> None:
        crescale_kernels.crescale_pre(self, batch)

    def post_update(self, batch: Batch) -> None:
        crescale_kernels.crescale_post(self, batch)
