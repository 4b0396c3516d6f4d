"""Entry point of alchemi-integrators: registers its components as strings; imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.plugin import hookimpl

if TYPE_CHECKING:
    from alchemi_core.plugin.registrar import Registrar

#: The per-system state fields each integrator keeps in the batch (its modules name them:
#: ``fire.FIRE_DT``, ``cell_filter.CELL_DOF``, ...). Registered with the integrator, so exports and
#: ``to_atoms`` leave them out without importing it; a test runs every integrator and checks the
#: fields it creates against these.
_FIRE_STATE = ("fire_dt", "fire_alpha", "fire_positive_steps", "fire_steps",
               "cell_filter_reference", "cell_filter_dof", "cell_filter_velocity")
_QN_STATE = ("qn_steps", "qn_previous_x", "qn_previous_gradient", "qn_previous_cell_x", "qn_previous_cell_gradient",
             "cell_filter_reference", "cell_filter_dof", "cell_filter_velocity")
_MTK_STATE = ("npt_strain_rate", "npt_thermostat_positions", "npt_thermostat_velocities",
              "npt_barostat_chain_positions", "npt_barostat_chain_velocities")
STATE_FIELDS: dict[str, tuple[str, ...]] = {
    "velocity-verlet": (),
    "langevin": ("langevin_noise_step",),
    "csvr": ("csvr_noise_step", "csvr_thermostat_energy"),
    "nose-hoover": ("nhc_positions", "nhc_velocities"),
    "fire": _FIRE_STATE,
    "fire2": _FIRE_STATE,
    "lbfgs": (*_QN_STATE, "lbfgs_history", "lbfgs_cell_history", "lbfgs_sy", "lbfgs_yy", "lbfgs_stamp"),
    "bfgs": (*_QN_STATE, "bfgs_hessian"),
    "npt-mtk": _MTK_STATE,
    "nph": _MTK_STATE,
    "npt-crescale": (),
}

_INTEGRATORS = (
    ("velocity-verlet", "verlet:VelocityVerlet", "NVE velocity Verlet (symplectic, time-reversible)"),
    ("langevin", "langevin:Langevin", "NVT Langevin dynamics, BAOAB splitting"),
    ("nose-hoover", "nose_hoover:NoseHooverChain", "NVT Nose-Hoover chains (MTK), with a conserved energy"),
    ("csvr", "csvr:CSVR", "NVT stochastic velocity rescaling (Bussi-Donadio-Parrinello 2007)"),
    ("fire", "fire:FIRE", "FIRE geometry optimiser (ASE's variant, per-system state)"),
    ("fire2", "fire:FIRE2", "FIRE 2.0 geometry optimiser (Guenole et al. 2020)"),
    ("lbfgs", "quasi_newton:LBFGS", "L-BFGS geometry optimiser (ASE's, per-system history, no line search)"),
    ("bfgs", "quasi_newton:BFGS", "BFGS geometry optimiser (ASE's, a dense Hessian per system)"),
    ("npt-mtk", "npt:NPTMTK", "NPT Martyna-Tobias-Klein with Nose-Hoover chains (isotropic or anisotropic)"),
    ("nph", "npt:NPH", "NPH: Martyna-Tobias-Klein without thermostats, with a conserved enthalpy"),
    ("npt-crescale", "npt:NPTCRescale", "NPT stochastic cell rescaling (Bernetti-Bussi 2020) with velocity rescaling"),
)


@hookimpl
def alchemi_register_integrators(registrar: Registrar) -> None:
    for name, target, summary in _INTEGRATORS:
        cls = target.split(":")[1]
        registrar.add(
            name,
            f"alchemi_integrators.{target}",
            summary=summary,
            exports=[f"alchemi_core.dynamics.{cls}"],
            state_fields=STATE_FIELDS[name],
        )
