"""Core's own components, registered through the same hooks as any plugin.

``alchemi list-plugins --all`` shows them as the plugin ``alchemi-core``.
"""

from __future__ import annotations

from alchemi_core.plugin.specs import hookimpl


@hookimpl
def alchemi_register_models(registrar):  # type: ignore[no-untyped-def]
    registrar.add(
        "demo",
        "alchemi_core.models.demo:DemoModelWrapper",
        summary="small deterministic pair model with exact forces (tests and examples)",
    )


@hookimpl
def alchemi_register_integrators(registrar):  # type: ignore[no-untyped-def]
    registrar.add(
        "demo",
        "alchemi_core.dynamics.demo:DemoDynamics",
        summary="velocity Verlet reference implementation (tests and examples)",
    )
    registrar.add(
        "static",
        "alchemi_core.dynamics.static:Static",
        summary="one model evaluation per structure: energy, forces, stress when asked (screening, labelling)",
    )


@hookimpl
def alchemi_register_sinks(registrar):  # type: ignore[no-untyped-def]
    registrar.add("host-memory", "alchemi_core.dynamics.sinks:HostMemory", summary="CPU-resident list of structures")


@hookimpl
def alchemi_register_comm_backends(registrar):  # type: ignore[no-untyped-def]
    registrar.add(
        "inprocess",
        "alchemi_core.comm.inprocess:InProcessBackend",
        summary="every rank in this process, tensors passed through queues (tests, one machine)",
    )


@hookimpl
def alchemi_register_buffers(registrar):  # type: ignore[no-untyped-def]
    # Not named "torch": buffer_ops_for() already falls back to it; listing it keeps the
    # choice visible in `alchemi list-components buffer`.
    registrar.add("torch", "alchemi_core.data.buffer_ops:TorchBufferOps", summary="portable torch row copies")
