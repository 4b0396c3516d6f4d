"""A well-behaved fake plugin: registers a model and an integrator that already exist in core."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.plugin import hookimpl

if TYPE_CHECKING:
    from alchemi_core.plugin.registrar import Registrar


@hookimpl
def alchemi_register_models(registrar: Registrar) -> None:
    registrar.add("fake-good", "alchemi_core.models.demo:DemoModelWrapper", summary="the demo model again")


@hookimpl
def alchemi_register_integrators(registrar: Registrar) -> None:
    registrar.add("fake-good", "alchemi_core.dynamics.demo:DemoDynamics")
