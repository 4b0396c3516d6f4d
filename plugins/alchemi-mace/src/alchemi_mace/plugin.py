"""Entry point of alchemi-mace: registers ``model:mace`` as a string; imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.plugin.specs import hookimpl

if TYPE_CHECKING:
    from alchemi_core.plugin.registrar import Registrar


@hookimpl
def alchemi_register_models(registrar: Registrar) -> None:
    registrar.add(
        "mace",
        "alchemi_mace.model:MaceModel",
        summary="MACE (mace-torch): batched message passing on alchemi's cell-list edges, CUDA-graph steps",
        requires={"mace": "mace-torch"},
    )
