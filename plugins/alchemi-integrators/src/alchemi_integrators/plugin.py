"""Entry point of alchemi-integrators: registers its components as strings; imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.plugin import hookimpl

if TYPE_CHECKING:
    from alchemi_core.plugin.registrar import Registrar

_INTEGRATORS = (
    ("velocity-verlet", "verlet:VelocityVerlet", "NVE velocity Verlet (symplectic, time-reversible)"),
    ("langevin", "langevin:Langevin", "NVT Langevin dynamics, BAOAB splitting"),
    ("nose-hoover", "nose_hoover:NoseHooverChain", "NVT Nose-Hoover chains (MTK), with a conserved energy"),
    ("fire", "fire:FIRE", "FIRE geometry optimiser (ASE's variant, per-system state)"),
    ("fire2", "fire:FIRE2", "FIRE 2.0 geometry optimiser (Guenole et al. 2020)"),
    ("npt-mtk", "npt:NPTMTK", "NPT Martyna-Tobias-Klein with Nose-Hoover chains (isotropic or anisotropic)"),
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
        )
