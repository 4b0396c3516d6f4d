"""A well-behaved fake plugin: registers a model and an integrator that already exist in core."""

from alchemi_core.plugin import hookimpl


@hookimpl
def alchemi_register_models(registrar):
    registrar.add("fake-good", "alchemi_core.models.demo:DemoModelWrapper", summary="the demo model again")


@hookimpl
def alchemi_register_integrators(registrar):
    registrar.add("fake-good", "alchemi_core.dynamics.demo:DemoDynamics")
