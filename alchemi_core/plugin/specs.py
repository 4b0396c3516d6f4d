"""The pluggy hook specifications every alchemi plugin implements.

A plugin is a module with functions marked ``@hookimpl`` whose names are the specs below. The
``alchemi_register_*`` hooks receive a :class:`~alchemi_core.plugin.registrar.Registrar` bound to
the calling plugin and record ``"package.module:Class"`` strings: nothing heavy is imported until
a component is asked for. The lifecycle hooks (``alchemi_run_start``/``_end``/``_error``) run once
per run, never per step: the per-step hook points are plain callables (see
``alchemi_core.dynamics.Hook``).

Every spec's docstring carries an example; ``docs/plugins.md`` documents each one (a test checks
that no spec is missing there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from alchemi_core.plugin.registrar import Registrar

PROJECT_NAME = "alchemi"
#: The entry-point group plugins are discovered through.
ENTRY_POINT_GROUP = "alchemi.plugins"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def alchemi_register_integrators(registrar: Registrar) -> None:
    """Register integrators (``BaseDynamics`` subclasses) as ``integrator:<name>``.

    Example:
        >>> @hookimpl
        ... def alchemi_register_integrators(registrar):
        ...     registrar.add("my-verlet", "my_pkg.verlet:MyVerlet", summary="NVE, velocity Verlet")
    """


@hookspec
def alchemi_register_models(registrar: Registrar) -> None:
    """Register potentials/models (callables returning energy, forces, stress) as ``model:<name>``.

    Example:
        >>> @hookimpl
        ... def alchemi_register_models(registrar):
        ...     registrar.add("lennard-jones", "my_pkg.lj:LennardJones", requires={"warp": "warp-lang"})
    """


@hookspec
def alchemi_register_hooks(registrar: Registrar) -> None:
    """Register per-step dynamics hooks as ``hook:<name>``; ``exports`` also makes them
    importable from ``alchemi_core.dynamics.hooks``.

    Example:
        >>> @hookimpl
        ... def alchemi_register_hooks(registrar):
        ...     registrar.add("max-force-clamp", "my_pkg.clamp:MaxForceClampHook",
        ...                   exports=["alchemi_core.dynamics.hooks.MaxForceClampHook"])
    """


@hookspec
def alchemi_register_sinks(registrar: Registrar) -> None:
    """Register data sinks (``DataSink`` subclasses) as ``sink:<name>``.

    Example:
        >>> @hookimpl
        ... def alchemi_register_sinks(registrar):
        ...     registrar.add("zarr", "my_pkg.zarr_sink:ZarrData",
        ...                   exports=["alchemi_core.dynamics.ZarrData"])
    """


@hookspec
def alchemi_register_comm_backends(registrar: Registrar) -> None:
    """Register transports for ``DistributedPipeline`` (``CommBackend`` subclasses) as
    ``comm:<name>``.

    Example:
        >>> @hookimpl
        ... def alchemi_register_comm_backends(registrar):
        ...     registrar.add("gloo", "my_pkg.dist:GlooBackend")
    """


@hookspec
def alchemi_register_buffers(registrar: Registrar) -> None:
    """Register row-copy implementations behind ``Batch.put``/``defrag``/``zero``
    (``alchemi_core.data.buffer_ops.BufferOps``) as ``buffer:<name>``.

    Example:
        >>> @hookimpl
        ... def alchemi_register_buffers(registrar):
        ...     registrar.add("warp", "my_pkg.ops:WarpBufferOps", requires={"warp": "warp-lang"})
    """


@hookspec
def alchemi_register_commands(registrar: Registrar) -> None:
    """Register click commands added to the ``alchemi`` command line as ``command:<name>``.

    Example:
        >>> @hookimpl
        ... def alchemi_register_commands(registrar):
        ...     registrar.add("convert", "my_pkg.cli:convert")  # a click.Command
    """


@hookspec
def alchemi_run_start(run: Any) -> None:
    """Called once when a dynamics run (``BaseDynamics.run``, ``FusedStage.run`` or a
    pipeline rank) starts, after its batch is ready and before the first step.

    Example:
        >>> @hookimpl
        ... def alchemi_run_start(run):
        ...     print("starting", type(run).__name__)
    """


@hookspec
def alchemi_run_end(run: Any, result: Any) -> None:
    """Called once when a run finishes normally; ``result`` is what ``run()`` returns.

    Example:
        >>> @hookimpl
        ... def alchemi_run_end(run, result):
        ...     print("finished after", run.step_count, "steps")
    """


@hookspec
def alchemi_run_error(run: Any, error: BaseException) -> None:
    """Called once when a run raises, before the error propagates.

    Example:
        >>> @hookimpl
        ... def alchemi_run_error(run, error):
        ...     print("run failed:", error)
    """


#: The registration hooks and the component kind each one fills.
REGISTRATION_HOOKS: dict[str, str] = {
    "alchemi_register_integrators": "integrator",
    "alchemi_register_models": "model",
    "alchemi_register_hooks": "hook",
    "alchemi_register_sinks": "sink",
    "alchemi_register_comm_backends": "comm",
    "alchemi_register_buffers": "buffer",
    "alchemi_register_commands": "command",
}
LIFECYCLE_HOOKS: tuple[str, ...] = ("alchemi_run_start", "alchemi_run_end", "alchemi_run_error")
ALL_HOOKS: tuple[str, ...] = (*REGISTRATION_HOOKS, *LIFECYCLE_HOOKS)
