"""The ``alchemi`` command line.

``alchemi --version`` loads no plugin; ``alchemi list-plugins`` imports only the plugins' thin
registration modules (no torch, warp or CUDA); plugins add commands through
``alchemi_register_commands``. Every command that prints data takes ``--json``.

Example::

    $ alchemi list-plugins
    $ alchemi list-plugins --json --strict
    $ alchemi list-components model
    $ alchemi run workflow.toml
    $ alchemi inspect results.zarr --plot plots/
"""

from __future__ import annotations

import sys
from typing import Any

import click

from alchemi_core import __version__
from alchemi_core.cli.listing import list_components, list_plugins
from alchemi_core.cli.scaffold import new_plugin

_BUILTIN_COMMANDS = {
    "list-plugins": list_plugins,
    "list-components": list_components,
    "new-plugin": new_plugin,
}
_LAZY_COMMANDS = {
    "demo": "alchemi_core.cli.demo:demo",
    "run": "alchemi_core.cli.run:run",
    "inspect": "alchemi_core.cli.results:inspect_store",
    "export": "alchemi_core.cli.results:export_store",
}


class AlchemiGroup(click.Group):
    """A group whose plugin commands are looked up only when asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = set(_BUILTIN_COMMANDS) | set(_LAZY_COMMANDS)
        names |= {r.name for r in _plugin_command_records()}
        return sorted(names)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in _BUILTIN_COMMANDS:
            return _BUILTIN_COMMANDS[cmd_name]
        if cmd_name in _LAZY_COMMANDS:
            return _load(_LAZY_COMMANDS[cmd_name])
        for rec in _plugin_command_records():
            if rec.name == cmd_name:
                from alchemi_core import registry

                cmd = registry.resolve(rec.spec)
                if not isinstance(cmd, click.Command):
                    raise click.ClickException(f"{rec.spec} from plugin {rec.plugin!r} is not a click command")
                return cmd
        return None


def _load(target: str) -> click.Command:
    import importlib

    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _plugin_command_records() -> list[Any]:
    from alchemi_core import registry

    try:
        return registry.available("command")
    except Exception:  # noqa: BLE001 - a broken plugin must not break the CLI
        return []


@click.group(cls=AlchemiGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="alchemi", message="%(prog)s %(version)s")
@click.option("-v", "--verbose", is_flag=True, help="Show Warp's messages and full tracebacks (ALCHEMI_VERBOSE=1).")
def main(verbose: bool) -> None:
    """alchemi: batched atomistic simulation on GPUs."""
    if verbose:
        import os

        os.environ["ALCHEMI_VERBOSE"] = "1"


if __name__ == "__main__":  # python -m alchemi_core.cli
    sys.exit(main())
