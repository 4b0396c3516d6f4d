"""Entry point of alchemi-sevennet: registers ``model:sevennet`` as a string; imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.plugin.specs import hookimpl

if TYPE_CHECKING:
    from alchemi_core.plugin.registrar import Registrar


@hookimpl
def alchemi_register_models(registrar: Registrar) -> None:
    registrar.add(
        "sevennet",
        "alchemi_sevennet.model:SevenNetModel",
        summary="SevenNet (sevenn; 7net-0 ships with it): batched message passing on alchemi's cell-list edges",
        requires={"sevenn": "sevenn"},
    )
