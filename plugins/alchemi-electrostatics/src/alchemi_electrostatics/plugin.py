"""Entry point of alchemi-electrostatics: registers its components as strings; imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.plugin.specs import hookimpl

if TYPE_CHECKING:
    from alchemi_core.plugin.registrar import Registrar

_NEEDS = {"nvalchemiops": "nvalchemi-toolkit-ops", "warp": "warp-lang"}


@hookimpl
def alchemi_register_models(registrar: Registrar) -> None:
    registrar.add(
        "ewald",
        "alchemi_electrostatics.ewald:Ewald",
        summary="Ewald summation of per-atom charges (nvalchemi-toolkit-ops) on alchemi's edges: periodic",
        requires=_NEEDS,
    )
    registrar.add(
        "pme",
        "alchemi_electrostatics.ewald:PME",
        summary="particle-mesh Ewald of per-atom charges (nvalchemi-toolkit-ops) on alchemi's edges: periodic",
        requires=_NEEDS,
    )
    registrar.add(
        "dsf",
        "alchemi_electrostatics.dsf:DSF",
        summary="damped shifted force Coulomb of per-atom charges (nvalchemi-toolkit-ops): molecules and crystals",
        requires=_NEEDS,
    )
