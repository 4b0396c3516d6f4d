"""A fake plugin implementing a misspelt hook."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.plugin import hookimpl

if TYPE_CHECKING:
    from alchemi_core.plugin.registrar import Registrar


@hookimpl
def alchemi_regster_models(registrar: Registrar) -> None:
    registrar.add("never", "alchemi_core.models.demo:DemoModelWrapper")
