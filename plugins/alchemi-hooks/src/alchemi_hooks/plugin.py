"""Entry point of alchemi-hooks: registers its hooks as strings; imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.plugin.specs import hookimpl

if TYPE_CHECKING:
    from alchemi_core.plugin.registrar import Registrar

#: (name, "module:Class", summary), in the order ``alchemi list-components hook`` shows them.
HOOKS = (
    ("max-force-clamp", "alchemi_hooks.clamp:MaxForceClampHook", "cap each atom's force norm, keeping its direction"),
    (
        "logging",
        "alchemi_hooks.logger:LoggingHook",
        "per-system step, energy, fmax, temperature to CSV or a callable, off the step path",
    ),
    ("snapshot", "alchemi_hooks.snapshot:SnapshotHook", "write the stage's systems to a DataSink every N steps"),
    ("converged-snapshot", "alchemi_hooks.snapshot:ConvergedSnapshotHook", "write just-converged systems to a sink"),
    ("nan-detector", "alchemi_hooks.nonfinite:NaNDetectorHook", "stop on NaN/inf, naming the systems and atoms"),
    ("energy-drift", "alchemi_hooks.drift:EnergyDriftMonitorHook", "warn or raise when total energy per atom drifts"),
    ("freeze-atoms", "alchemi_hooks.freeze:FreezeAtomsHook", "hold atoms marked frozen in place"),
    ("wrap-periodic", "alchemi_hooks.wrap:WrapPeriodicHook", "wrap positions into the cell along periodic axes"),
    ("progress", "alchemi_hooks.progress:ProgressHook", "live progress: steps, systems done/active, atom-steps/s"),
    ("stage-timing", "alchemi_hooks.timing:StageTimingHook", "time per phase of the step, with a summary table"),
)


@hookimpl
def alchemi_register_hooks(registrar: Registrar) -> None:
    for name, target, summary in HOOKS:
        cls = target.rsplit(":", 1)[1]
        registrar.add(name, target, summary=summary, exports=[f"alchemi_core.dynamics.hooks.{cls}"])
