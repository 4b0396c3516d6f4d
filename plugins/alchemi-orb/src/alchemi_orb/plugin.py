"""Entry point of alchemi-orb: registers ``model:orb`` as a string; imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.plugin.specs import hookimpl

if TYPE_CHECKING:
    from alchemi_core.plugin.registrar import Registrar


@hookimpl
def alchemi_register_models(registrar: Registrar) -> None:
    registrar.add(
        "orb",
        "alchemi_orb.model:OrbModel",
        summary="ORB (orb-models; orb-v3 conservative and direct, orb-v2): batched on ORB's own graphs",
        requires={"orb_models": "orb-models"},
    )
