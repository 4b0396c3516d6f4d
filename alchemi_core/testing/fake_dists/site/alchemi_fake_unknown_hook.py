"""A fake plugin implementing a misspelt hook."""

from alchemi_core.plugin import hookimpl


@hookimpl
def alchemi_regster_models(registrar):
    registrar.add("never", "alchemi_core.models.demo:DemoModelWrapper")
