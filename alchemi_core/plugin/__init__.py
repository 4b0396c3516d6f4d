"""Plugins: pluggy hook specs, the registrar plugins write to, and entry-point discovery.

Example: a plugin module (named by an entry point in the group ``alchemi.plugins``)::

    from alchemi_core.plugin import hookimpl

    @hookimpl
    def alchemi_register_integrators(registrar):
        registrar.add("my-verlet", "my_pkg.verlet:MyVerlet", summary="NVE, velocity Verlet")
"""

from __future__ import annotations

from alchemi_core.plugin.registrar import ComponentRecord, Registrar
from alchemi_core.plugin.specs import ENTRY_POINT_GROUP, hookimpl, hookspec

__all__ = ["ENTRY_POINT_GROUP", "ComponentRecord", "Registrar", "hookimpl", "hookspec"]
