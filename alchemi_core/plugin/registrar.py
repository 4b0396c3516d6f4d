"""What a plugin's registration hook writes to: records of components, never imports.

Example:
    >>> from alchemi_core.plugin.registrar import Registrar
    >>> r = Registrar(kind="model", plugin="my-plugin")
    >>> r.add("lj", "my_pkg.lj:LennardJones", summary="Lennard-Jones")
    >>> r.records[0].spec
    'model:lj'
"""

from __future__ import annotations

import re

import attrs

from alchemi_core.errors import ConfigurationError

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_TARGET = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@attrs.frozen
class ComponentRecord:
    """One registered component: where it lives and who provides it."""

    kind: str
    name: str
    target: str  # "package.module:attr"
    plugin: str
    summary: str = ""
    exports: tuple[str, ...] = ()  # public names, e.g. "alchemi_core.dynamics.GPUBuffer"
    requires: tuple[tuple[str, str], ...] = ()  # (import name, what to pip install)
    #: Batch fields the component keeps for itself while it runs (an integrator's per-system
    #: state): stored with a record, never handed to ASE (``to_atoms`` leaves them out).
    state_fields: tuple[str, ...] = ()

    @property
    def spec(self) -> str:
        return f"{self.kind}:{self.name}"


@attrs.frozen
class ExportRecord:
    """A public name (``alchemi_core.<module>.<Name>``) served from a plugin."""

    public: str
    target: str
    plugin: str


class Registrar:
    """Collects one plugin's registrations for one kind of component.

    Args:
        kind: The component kind this registrar fills (``model``, ``integrator``, ...).
        plugin: The name of the plugin calling it (errors and listings name it).
    """

    def __init__(self, kind: str, plugin: str) -> None:
        self.kind = kind
        self.plugin = plugin
        self.records: list[ComponentRecord] = []
        self.exports: list[ExportRecord] = []

    def add(
        self,
        name: str,
        target: str,
        *,
        summary: str = "",
        exports: list[str] | tuple[str, ...] = (),
        requires: dict[str, str] | None = None,
        state_fields: list[str] | tuple[str, ...] = (),
    ) -> None:
        """Register ``kind:name`` as the object at ``target``.

        Args:
            name: Lower-case name, e.g. ``"lennard-jones"``.
            target: ``"package.module:attr"``; imported only when the component is used.
            summary: One line for ``alchemi list-components``.
            exports: Public names under ``alchemi_core`` that resolve to this component.
            requires: Optional packages it imports, as ``{import name: pip requirement}``, so a
                missing one is reported with what to install.
            state_fields: Batch fields the component creates for its own state (an integrator's
                ``fire_dt``): engine state, which ``to_atoms`` and exports leave out.

        Raises:
            ConfigurationError: A malformed name or target.
        """
        if not _NAME.match(name):
            raise ConfigurationError(
                f"plugin {self.plugin!r} registers {self.kind} name {name!r}: names are lower-case "
                "letters, digits, '-', '_' and '.'"
            )
        if not _TARGET.match(target):
            raise ConfigurationError(
                f"plugin {self.plugin!r} registers {self.kind}:{name} with target {target!r}; "
                "write it as 'package.module:attribute'"
            )
        self.records.append(ComponentRecord(
            kind=self.kind, name=name, target=target, plugin=self.plugin, summary=summary, exports=tuple(exports),
            requires=tuple((requires or {}).items()), state_fields=tuple(state_fields),
        ))
        for public in exports:
            self.export(public, target)

    def export(self, public: str, target: str) -> None:
        """Serve ``public`` (``"alchemi_core.data.datapipes.Reader"``) from ``target``, for names
        that are not components of a kind (readers, helpers)."""
        if not public.startswith("alchemi_core.") or public.count(".") < 2:
            raise ConfigurationError(
                f"plugin {self.plugin!r} exports {public!r}: exported names look like "
                "'alchemi_core.<module>.<Name>'"
            )
        self.exports.append(ExportRecord(public=public, target=target, plugin=self.plugin))
