"""alchemi-integrators: velocity Verlet, Langevin (BAOAB), Nose-Hoover chains, CSVR (Bussi), FIRE,
FIRE2, L-BFGS and BFGS (with cell filters), NPT (MTK and C-rescale) and NPH (MTK).

Every integrator is a ``BaseDynamics`` found by name (``integrator:velocity-verlet``,
``integrator:langevin``, ``integrator:nose-hoover``, ``integrator:csvr``, ``integrator:fire``,
``integrator:fire2``, ``integrator:lbfgs``, ``integrator:bfgs``, ``integrator:npt-mtk``, ``integrator:npt-crescale``, ``integrator:nph``)
and imported from here or from ``alchemi_core.dynamics``. Parameters take a number, one value per
system, or a batch field's name (:mod:`alchemi_integrators.parameters`); :mod:`.thermo` has the
per-system kinetic energy, temperature and Maxwell-Boltzmann velocities.

Example:
    >>> from alchemi_integrators import Langevin, initialize_velocities, temperature  # doctest: +SKIP
"""

from __future__ import annotations

from alchemi_core.lazy import lazy_exports

__version__ = "0.1.0"

_LAZY = {
    "VelocityVerlet": "alchemi_integrators.verlet",
    "Langevin": "alchemi_integrators.langevin",
    "NoseHooverChain": "alchemi_integrators.nose_hoover",
    "CSVR": "alchemi_integrators.csvr",
    "FIRE": "alchemi_integrators.fire",
    "FIRE2": "alchemi_integrators.fire",
    "LBFGS": "alchemi_integrators.quasi_newton",
    "BFGS": "alchemi_integrators.quasi_newton",
    "NPTMTK": "alchemi_integrators.npt",
    "NPTCRescale": "alchemi_integrators.npt",
    "NPH": "alchemi_integrators.npt",
    "initialize_velocities": "alchemi_integrators.thermo",
    "kinetic_energy": "alchemi_integrators.thermo",
    "temperature": "alchemi_integrators.thermo",
    "degrees_of_freedom": "alchemi_integrators.thermo",
    "remove_com_velocity": "alchemi_integrators.thermo",
}

__all__ = sorted(_LAZY)

# Lazy, so the plugin entry point imports nothing heavy.
__getattr__ = lazy_exports(__name__, _LAZY)
