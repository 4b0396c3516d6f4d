"""Entry point of alchemi-warp: registers its components as strings; imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.plugin import hookimpl

if TYPE_CHECKING:
    from alchemi_core.plugin.registrar import Registrar


@hookimpl
def alchemi_register_sinks(registrar: Registrar) -> None:
    registrar.add(
        "gpu-buffer",
        "alchemi_warp.gpu_buffer:GPUBuffer",
        summary="fixed-size device-resident store of systems, allocated once (Batch.put copies)",
        exports=["alchemi_core.dynamics.GPUBuffer"],
    )


@hookimpl
def alchemi_register_buffers(registrar: Registrar) -> None:
    registrar.add(
        "warp",
        "alchemi_warp.buffer_ops:WarpBufferOps",
        summary="Warp kernels behind Batch.put/defrag/zero on CUDA (every dtype, bit-identical)",
        requires={"warp": "warp-lang"},
    )
