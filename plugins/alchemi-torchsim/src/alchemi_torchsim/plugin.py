"""Entry point of alchemi-torchsim: registers ``model:torchsim`` as a string; imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.plugin.specs import hookimpl

if TYPE_CHECKING:
    from alchemi_core.plugin.registrar import Registrar


@hookimpl
def alchemi_register_models(registrar: Registrar) -> None:
    registrar.add(
        "torchsim",
        "alchemi_torchsim.model:TorchSimModel",
        summary="any TorchSim ModelInterface (torch-sim-atomistic): the model's own neighbour list, batched",
        requires={"torch_sim": "torch-sim-atomistic"},
    )
