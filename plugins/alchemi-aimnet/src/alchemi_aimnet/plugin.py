"""Entry point of alchemi-aimnet: registers ``model:aimnet2`` as a string; imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.plugin.specs import hookimpl

if TYPE_CHECKING:
    from alchemi_core.plugin.registrar import Registrar


@hookimpl
def alchemi_register_models(registrar: Registrar) -> None:
    registrar.add(
        "aimnet2",
        "alchemi_aimnet.model:AIMNet2Model",
        summary="AIMNet2 (aimnet): molecules and periodic cells, total charge in, partial charges out",
        requires={"aimnet": "aimnet"},
    )
