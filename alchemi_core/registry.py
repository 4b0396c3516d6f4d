"""Find components by ``"kind:name"``: the second way into alchemi, beside imports.

Plugins register ``"package.module:Class"`` strings; :func:`resolve` imports one when it is asked
for, :func:`build` also calls it with keyword arguments, so a workflow file can name everything.

Example:
    >>> from alchemi_core import registry
    >>> registry.resolve("model:demo").__name__
    'DemoModelWrapper'
    >>> model = registry.build("model:demo")
    >>> "sink:host-memory" in [r.spec for r in registry.available("sink")]
    True

Errors say what is wrong and what to do: an unknown name lists what is available and the closest
match; two plugins providing one name are both named; a component whose plugin failed shows that
plugin's error; a missing optional dependency says what to install.
"""

from __future__ import annotations

import difflib
import importlib
import threading
from typing import Any

from alchemi_core.errors import (
    ComponentConflictError,
    ComponentNotFoundError,
    MissingDependencyError,
    PluginLoadError,
)
from alchemi_core.plugin import first_party
from alchemi_core.plugin.manager import PluginManager, PluginRecord
from alchemi_core.plugin.registrar import ComponentRecord

__all__ = [
    "FIRST_PARTY",
    "available",
    "build",
    "manager",
    "plugins",
    "reset",
    "resolve",
    "resolve_export",
    "use_manager",
]

#: The first-party plugins and what they provide, so a missing one can be named exactly (derived
#: from ``alchemi_core.plugin.first_party``, the one list of them).
FIRST_PARTY: dict[str, tuple[str, ...]] = first_party.provides()

_lock = threading.RLock()
_manager: PluginManager | None = None


def manager() -> PluginManager:
    """The process-wide plugin manager, discovering plugins on first use."""
    global _manager
    with _lock:
        if _manager is None:
            _manager = PluginManager.discover()
        return _manager


def use_manager(pm: PluginManager | None) -> PluginManager | None:
    """Install ``pm`` as the process-wide manager (tests); returns the previous one."""
    global _manager
    with _lock:
        old, _manager = _manager, pm
        return old


def reset() -> None:
    """Forget discovered plugins; the next query discovers them again."""
    use_manager(None)


def plugins() -> list[PluginRecord]:
    """Every plugin discovery saw, built-in first."""
    return sorted(manager().records.values(), key=lambda r: (not r.builtin, r.name))


def available(kind: str | None = None) -> list[ComponentRecord]:
    """Registered components, sorted, optionally of one kind (``"model"``, ``"sink"``, ...)."""
    out = [recs[0] for spec, recs in manager().components.items() if kind is None or recs[0].kind == kind]
    return sorted(out, key=lambda r: (r.kind, r.name))


def engine_state_fields() -> frozenset[str]:
    """Every batch field that is engine state rather than data about a structure: the engine's
    own (``alchemi_core.data.fields.ENGINE_STATE_FIELDS``) and those each registered component
    names as its state (an integrator's ``fire_dt``). ``to_atoms`` and exports leave them out."""
    from alchemi_core.data.fields import ENGINE_STATE_FIELDS

    named = (f for recs in manager().components.values() for r in recs for f in r.state_fields)
    return ENGINE_STATE_FIELDS.union(named)


def _split(spec: str) -> tuple[str, str]:
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ComponentNotFoundError(
            f"components are named 'kind:name' (e.g. 'model:lennard-jones'), got {spec!r}"
        )
    kind, name = spec.split(":")
    return kind.strip(), name.strip()


def _failed_provider(key: str) -> PluginRecord | None:
    pm = manager()
    for dist, provided in FIRST_PARTY.items():
        if key in provided:
            for rec in pm.records.values():
                if rec.distribution == dist or rec.name == dist:
                    return rec
            return PluginRecord(name=dist, distribution=dist, version="", status="missing")
    return None


def _not_found(spec: str, kind: str, name: str) -> Exception:
    pm = manager()
    provider = _failed_provider(spec)
    if provider is not None and provider.status == "failed":
        return PluginLoadError(
            f"{spec} is provided by plugin {provider.name!r} ({provider.distribution}), which failed "
            f"to load: {provider.error}. Run 'alchemi list-plugins -v' for the traceback"
        )
    if provider is not None and provider.status == "disabled":
        return ComponentNotFoundError(
            f"{spec} is provided by plugin {provider.name!r}, which ALCHEMI_DISABLE_PLUGINS blocks"
        )
    same_kind = sorted(r.name for r in available(kind))
    kinds = sorted({r.kind for r in available()})
    msg = f"no component {spec!r}."
    close = difflib.get_close_matches(name, same_kind, n=1, cutoff=0.5)
    if close:
        msg += f" Did you mean '{kind}:{close[0]}'?"
    if kind not in kinds:
        close_kind = difflib.get_close_matches(kind, kinds, n=1)
        msg += f" Unknown kind {kind!r}" + (f" (did you mean {close_kind[0]!r}?)" if close_kind else "")
        msg += f"; kinds are: {', '.join(kinds)}."
    else:
        msg += f" Available {kind} components: {', '.join(same_kind)}."
    if provider is not None and provider.status == "missing":
        msg += f" {spec} comes with the distribution {provider.distribution}: pip install {provider.distribution}"
    failed = [r for r in pm.records.values() if r.status == "failed"]
    if failed:
        msg += " Plugins that failed to load and may provide it: " + "; ".join(
            f"{r.name} ({r.error})" for r in failed
        )
    return ComponentNotFoundError(msg)


def _import_target(target: str, who: str, plugin: str, requires: tuple[tuple[str, str], ...] = ()) -> Any:
    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        top = missing.split(".")[0]
        own = module_name.split(".")[0]
        if top and top != own:
            hint = dict(requires).get(top, top)
            raise MissingDependencyError(
                f"{who} (plugin {plugin!r}) needs the package {top!r}, which is not installed: "
                f"pip install {hint}"
            ) from exc
        raise PluginLoadError(f"{who} (plugin {plugin!r}) could not be imported from {target!r}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - report any import-time failure with its plugin
        raise PluginLoadError(
            f"{who} (plugin {plugin!r}) failed while importing {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise PluginLoadError(
                f"{who} (plugin {plugin!r}) points at {target!r}, but {module_name!r} has no {attr!r}"
            ) from exc
    return obj


def resolve(spec: str) -> Any:
    """The object registered as ``spec`` (``"kind:name"``), imported on first use.

    Raises:
        ComponentNotFoundError: Unknown name (with the closest match and what is available).
        ComponentConflictError: Two plugins register the name.
        PluginLoadError: The providing plugin failed; its error is in the message.
        MissingDependencyError: The component needs a package that is not installed.
    """
    kind, name = _split(spec)
    key = f"{kind}:{name}"
    recs = manager().components.get(key)
    if not recs:
        raise _not_found(key, kind, name)
    if len(recs) > 1:
        who = " and ".join(f"{r.plugin!r} ({r.target})" for r in recs)
        raise ComponentConflictError(
            f"{key} is registered by two plugins: {who}. Uninstall one, or block it with "
            f"ALCHEMI_DISABLE_PLUGINS={recs[-1].plugin}"
        )
    rec = recs[0]
    return _import_target(rec.target, key, rec.plugin, rec.requires)


def build(spec: str, /, *args: Any, **kwargs: Any) -> Any:
    """``resolve(spec)(*args, **kwargs)``: an instance of the named component, e.g.
    ``build("model:ase", EMT())``.

    Example:
        >>> sink = build("sink:host-memory", capacity=10)
        >>> sink.capacity
        10
    """
    return resolve(spec)(*args, **kwargs)


def resolve_export(module: str, attr: str) -> Any:
    """The object a plugin serves as ``module.attr`` (a public name under ``alchemi_core``).

    Core modules call this from ``__getattr__``, so ``from alchemi_core.dynamics import
    GPUBuffer`` works when ``alchemi-warp`` is installed and says what to install when not.

    Raises:
        AttributeError: No plugin serves the name (also an ImportError for ``from`` imports);
            the message names the distribution to install when it is first-party.
    """
    public = f"{module}.{attr}"
    recs = manager().exports.get(public)
    if recs:
        if len(recs) > 1:
            who = " and ".join(repr(r.plugin) for r in recs)
            raise ComponentConflictError(f"{public} is exported by two plugins: {who}")
        return _import_target(recs[0].target, public, recs[0].plugin)
    provider = _failed_provider(public)
    if provider is None:
        raise AttributeError(f"module {module!r} has no attribute {attr!r}")
    if provider.status == "failed":
        raise _ExportError(
            f"{attr} comes from plugin {provider.name!r} ({provider.distribution}), which failed to load: "
            f"{provider.error}"
        )
    if provider.status == "disabled":
        raise _ExportError(f"{attr} comes from plugin {provider.name!r}, which ALCHEMI_DISABLE_PLUGINS blocks")
    raise _ExportError(
        f"{attr} is provided by the plugin distribution {provider.distribution}, which is not "
        f"installed: pip install {provider.distribution}"
    )


class _ExportError(PluginLoadError):
    """Raised by a module ``__getattr__`` for a plugin-provided name that cannot be served.

    Deliberately not an AttributeError: ``from x import Name`` would swallow it and print a bare
    "cannot import name"; as an ImportError the message saying what to install reaches the user.
    """
