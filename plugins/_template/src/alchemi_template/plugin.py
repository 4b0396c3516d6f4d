"""Entry point of alchemi-template: registers components as strings; imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.plugin import hookimpl

if TYPE_CHECKING:
    from alchemi_core.plugin.registrar import Registrar


@hookimpl
def alchemi_register_integrators(registrar: Registrar) -> None:
    registrar.add(
        "template-euler",
        "alchemi_template.integrator:SymplecticEuler",
        summary="symplectic Euler (kick, then drift with the new velocity)",
    )
