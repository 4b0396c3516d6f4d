"""Entry point of alchemi-nccl: registers its components as strings; imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.plugin import hookimpl

if TYPE_CHECKING:
    from alchemi_core.plugin.registrar import Registrar


@hookimpl
def alchemi_register_comm_backends(registrar: Registrar) -> None:
    registrar.add(
        "nccl",
        "alchemi_nccl.backend:NcclBackend",
        summary="torch.distributed over NCCL between GPUs, one GPU per rank (torchrun)",
    )
    registrar.add(
        "gloo",
        "alchemi_nccl.backend:GlooBackend",
        summary="torch.distributed over gloo (TCP) between CPU processes (torchrun)",
    )
