"""Plugin discovery: load every ``alchemi.plugins`` entry point on its own and record the outcome.

A plugin that fails to import, implements an unknown hook or raises while registering is
recorded as ``failed`` with its error, and the others load as usual. ``ALCHEMI_DISABLE_PLUGINS=a,b``
blocks plugins (by entry point or distribution name); ``ALCHEMI_STRICT_PLUGINS=1`` turns failures
into errors. Discovery imports only the plugins' thin registration modules.

Example:
    >>> from alchemi_core.plugin.manager import PluginManager
    >>> pm = PluginManager.discover(entry_points=False)   # core's built-ins only
    >>> pm.record("alchemi-core").status
    'ok'
"""

from __future__ import annotations

import difflib
import importlib.metadata as md
import os
import traceback
from collections.abc import Iterable
from types import ModuleType
from typing import Any

import attrs
import pluggy

from alchemi_core.errors import PluginLoadError
from alchemi_core.plugin import specs
from alchemi_core.plugin.registrar import ComponentRecord, ExportRecord, Registrar

BUILTIN_PLUGIN = "alchemi-core"
OK, FAILED, DISABLED = "ok", "failed", "disabled"


@attrs.define
class PluginRecord:
    """What discovery learned about one plugin."""

    name: str
    distribution: str
    version: str
    status: str  # ok | failed | disabled
    entry_point: str = ""
    module: str = ""
    error: str = ""  # one line
    traceback: str = ""
    builtin: bool = False
    provides: list[str] = attrs.field(factory=list)

    def as_dict(self, verbose: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "status": self.status,
            "builtin": self.builtin,
            "provides": list(self.provides),
        }
        if self.error:
            out["error"] = self.error
        if verbose:
            out["entry_point"] = self.entry_point
            out["module"] = self.module
            if self.traceback:
                out["traceback"] = self.traceback
        return out


def _env_list(name: str) -> set[str]:
    return {p.strip() for p in os.environ.get(name, "").split(",") if p.strip()}


def strict_from_env() -> bool:
    return os.environ.get("ALCHEMI_STRICT_PLUGINS", "").strip().lower() in ("1", "true", "yes", "on")


class PluginManager:
    """The loaded plugins, their records and every component and export they registered."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(specs.PROJECT_NAME)
        self.pm.add_hookspecs(specs)
        self.records: dict[str, PluginRecord] = {}
        self.components: dict[str, list[ComponentRecord]] = {}  # "kind:name" -> providers
        self.exports: dict[str, list[ExportRecord]] = {}  # public name -> providers

    # ------------------------------------------------------------------ discovery
    @classmethod
    def discover(
        cls,
        *,
        entry_points: bool | Iterable[md.EntryPoint] = True,
        strict: bool | None = None,
        disabled: Iterable[str] | None = None,
        builtins: bool = True,
    ) -> PluginManager:
        """Load the built-in plugin and every installed plugin.

        Args:
            entry_points: True to read installed entry points, False for none, or an explicit
                iterable (tests).
            strict: Raise on the first failed plugin; default from ``ALCHEMI_STRICT_PLUGINS``.
            disabled: Plugin or distribution names to skip; default from
                ``ALCHEMI_DISABLE_PLUGINS``.
            builtins: Register core's own components (demo model, host-memory sink, ...).

        Raises:
            PluginLoadError: In strict mode, naming the plugin and its error.
        """
        self = cls()
        strict = strict_from_env() if strict is None else strict
        blocked = _env_list("ALCHEMI_DISABLE_PLUGINS") if disabled is None else set(disabled)
        if builtins:
            from alchemi_core.plugin import builtin

            self._load_module(BUILTIN_PLUGIN, builtin, "alchemi-core", _core_version(), "(built in)", True, strict)
        if entry_points is True:
            eps: Iterable[md.EntryPoint] = md.entry_points(group=specs.ENTRY_POINT_GROUP)
        elif entry_points is False:
            eps = ()
        else:
            eps = entry_points
        seen: set[str] = set()
        for ep in sorted(eps, key=lambda e: e.name):
            if ep.name in seen:  # the same distribution found twice on sys.path
                continue
            seen.add(ep.name)
            dist_name = ep.dist.name if ep.dist is not None else "?"
            version = ep.dist.version if ep.dist is not None else "?"
            ep_text = f"{ep.name} = {ep.value}"
            if ep.name in blocked or dist_name in blocked:
                self.records[ep.name] = PluginRecord(
                    name=ep.name, distribution=dist_name, version=version, status=DISABLED,
                    entry_point=ep_text, module=ep.module,
                )
                continue
            try:
                module = ep.load()
            except BaseException as exc:  # noqa: BLE001 - any import failure is the plugin's
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                self._fail(ep.name, dist_name, version, ep_text, ep.module, exc, strict)
                continue
            if not isinstance(module, ModuleType):
                self._fail(
                    ep.name, dist_name, version, ep_text, ep.module,
                    TypeError(f"entry point {ep_text!r} must name a module, not {type(module).__name__}"),
                    strict,
                )
                continue
            self._load_module(ep.name, module, dist_name, version, ep_text, False, strict)
        return self

    def _fail(self, name: str, dist: str, version: str, ep_text: str, module: str,
              exc: BaseException, strict: bool) -> None:
        line = f"{type(exc).__name__}: {exc}"
        self.records[name] = PluginRecord(
            name=name, distribution=dist, version=version, status=FAILED, entry_point=ep_text,
            module=module, error=line,
            traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        )
        if strict:
            raise PluginLoadError(
                f"plugin {name!r} (distribution {dist} {version}) failed to load: {line}. "
                "Fix or uninstall it, or block it with ALCHEMI_DISABLE_PLUGINS="
                f"{name}; unset ALCHEMI_STRICT_PLUGINS to load the others anyway"
            ) from exc

    def _load_module(self, name: str, module: ModuleType, dist: str, version: str, ep_text: str,
                     builtin: bool, strict: bool) -> None:
        try:
            unknown = [
                attr for attr in dir(module)
                if attr.startswith("alchemi_") and attr not in specs.ALL_HOOKS
                and callable(getattr(module, attr))
                and getattr(getattr(module, attr), specs.PROJECT_NAME + "_impl", None) is not None
            ]
            if unknown:
                hints = []
                for u in unknown:
                    close = difflib.get_close_matches(u, specs.ALL_HOOKS, n=1)
                    hints.append(f"{u!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
                raise PluginLoadError(f"implements unknown hook {', '.join(hints)}")
            self.pm.register(module, name=name)
            try:
                self.pm.check_pending()
                regs, exps = self._collect(name)
            except BaseException:
                self.pm.unregister(name=name)
                raise
        except BaseException as exc:  # noqa: BLE001
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            self._fail(name, dist, version, ep_text, module.__name__, exc, strict)
            return
        record = PluginRecord(
            name=name, distribution=dist, version=version, status=OK, entry_point=ep_text,
            module=module.__name__, builtin=builtin,
        )
        for r in regs:
            self.components.setdefault(r.spec, []).append(r)
            record.provides.append(r.spec)
        for e in exps:
            self.exports.setdefault(e.public, []).append(e)
        self.records[name] = record

    def _collect(self, name: str) -> tuple[list[ComponentRecord], list[ExportRecord]]:
        """Call this plugin's registration hooks only, each with a registrar bound to it."""
        regs: list[ComponentRecord] = []
        exps: list[ExportRecord] = []
        for hook_name, kind in specs.REGISTRATION_HOOKS.items():
            caller = getattr(self.pm.hook, hook_name)
            for impl in caller.get_hookimpls():
                if impl.plugin_name != name:
                    continue
                registrar = Registrar(kind=kind, plugin=name)
                impl.function(registrar=registrar)
                regs.extend(registrar.records)
                exps.extend(registrar.exports)
        return regs, exps

    # ------------------------------------------------------------------ queries
    def record(self, name: str) -> PluginRecord:
        return self.records[name]

    def failed(self) -> list[PluginRecord]:
        return [r for r in self.records.values() if r.status == FAILED]

    def lifecycle(self, hook: str, **kwargs: Any) -> None:
        """Call a run-lifecycle hook on every loaded plugin (once per run, never per step)."""
        getattr(self.pm.hook, hook)(**kwargs)


def _core_version() -> str:
    try:
        return md.version("alchemi-core")
    except md.PackageNotFoundError:  # running from a source tree
        from alchemi_core import __version__

        return __version__
