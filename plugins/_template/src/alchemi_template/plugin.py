"""Entry point of alchemi-template: registers components as strings; imports nothing heavy."""

from __future__ import annotations

from alchemi_core.plugin import hookimpl


@hookimpl
def alchemi_register_integrators(registrar):  # type: ignore[no-untyped-def]
    registrar.add(
        "template-euler",
        "alchemi_template.integrator:SymplecticEuler",
        summary="symplectic Euler (kick, then drift with the new velocity)",
    )
