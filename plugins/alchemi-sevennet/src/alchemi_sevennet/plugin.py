"""Entry point of alchemi-sevennet: registers ``model:sevennet`` as a string; imports nothing heavy."""

from __future__ import annotations

from alchemi_core.plugin.specs import hookimpl


@hookimpl
def alchemi_register_models(registrar: Registrar) -> None:
    registrar.add(
        "sevennet",
        "alchemi_sevennet.model:SevenNetModel",
        summary="SevenNet (sevenn; 7net-0 ships with it): batched message passing on alchemi's cell-list edges",
        requires={"sevenn": "sevenn"},
    )
