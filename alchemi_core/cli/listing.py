"""``alchemi list-plugins`` and ``alchemi list-components``."""

from __future__ import annotations

import json
from collections.abc import Sequence

import click

#: Version of the ``--json`` output of the listing commands.
JSON_SCHEMA_VERSION = 1


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain fixed-width table (no third-party dependency)."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    line = "  ".join("-" * w for w in widths)
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*headers), line]
    out.extend(fmt.format(*row) for row in rows)
    return "\n".join(s.rstrip() for s in out)


@click.command("list-plugins")
@click.option("--json", "as_json", is_flag=True, help="Print a versioned JSON object instead of a table.")
@click.option("-v", "--verbose", is_flag=True, help="Show entry points, modules and full errors.")
@click.option("--kind", default=None, help="Only show components of this kind (model, integrator, ...).")
@click.option("--strict", is_flag=True, help="Exit with status 1 when a plugin failed to load.")
@click.option("--all", "show_all", is_flag=True, help="Include core's built-in components.")
def list_plugins(as_json: bool, verbose: bool, kind: str | None, strict: bool, show_all: bool) -> None:
    """List installed plugins, their status and what they provide."""
    from alchemi_core import __version__, registry

    records = [r for r in registry.plugins() if show_all or not r.builtin]
    failed = [r for r in records if r.status == "failed"]
    if as_json:
        plugins = [r.as_dict(verbose=verbose) for r in records]
        for d in plugins:
            d["provides"] = [p for p in d["provides"] if not kind or p.split(":")[0] == kind]
        payload = {"schema_version": JSON_SCHEMA_VERSION, "alchemi_core": __version__, "plugins": plugins}
        click.echo(json.dumps(payload, indent=2))
    else:
        rows = []
        for r in records:
            provides = [p for p in r.provides if not kind or p.split(":")[0] == kind]
            text = ", ".join(provides) if provides else ("-" if r.status == "ok" else r.error)
            rows.append([r.name, r.version, r.status, text])
        if rows:
            click.echo(render_table(["Plugin", "Version", "Status", "Provides"], rows))
        else:
            click.echo("No plugins installed (core's built-ins: alchemi list-plugins --all).")
        if verbose:
            for r in records:
                click.echo(f"\n{r.name}: entry point {r.entry_point or '-'}, module {r.module or '-'}")
                if r.traceback:
                    click.echo(r.traceback.rstrip())
        elif failed:
            click.echo(f"\n{len(failed)} plugin(s) failed to load; alchemi list-plugins -v shows why.", err=True)
    if strict and failed:
        raise SystemExit(1)


@click.command("list-components")
@click.argument("kind", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print a versioned JSON object instead of a table.")
@click.option("--models", "models", is_flag=True,
              help="List the published models each installed model family resolves by name, and which are here.")
def list_components(kind: str | None, as_json: bool, models: bool) -> None:
    """List registered components (optionally of one KIND), with the plugin providing each."""
    import difflib

    from alchemi_core import registry

    if models:
        _list_models(as_json)
        return
    recs = registry.available(kind)
    pm = registry.manager()
    if kind is not None and not recs:
        kinds = sorted({r.kind for r in registry.available()})
        close = difflib.get_close_matches(kind, kinds, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        click.echo(f"alchemi: error: no components of kind {kind!r}{hint}; kinds are: {', '.join(kinds)}", err=True)
        raise SystemExit(2)
    if as_json:
        components = [{"spec": r.spec, "kind": r.kind, "name": r.name, "target": r.target, "plugin": r.plugin,
                       "summary": r.summary, "providers": [p.plugin for p in pm.components[r.spec]]} for r in recs]
        click.echo(json.dumps({"schema_version": JSON_SCHEMA_VERSION, "components": components}, indent=2))
        return
    rows = []
    for r in recs:
        providers = pm.components[r.spec]
        plugin = r.plugin if len(providers) == 1 else "CONFLICT: " + " and ".join(p.plugin for p in providers)
        rows.append([r.spec, plugin, r.summary])
    if not rows:
        click.echo("No components registered (alchemi list-plugins shows what is installed).")
        return
    click.echo(render_table(["Component", "Plugin", "Summary"], rows))


def _list_models(as_json: bool) -> None:
    """``list-components --models``: every name each ``model:`` family's ``known_models()`` gives
    (a family whose package is not installed is listed with the reason)."""
    from alchemi_core import registry
    from alchemi_core.models.base import MODEL_DIR_VARIABLE, KnownModel

    found: list[tuple[str, KnownModel]] = []
    unavailable: dict[str, str] = {}
    for rec in registry.available("model"):
        try:
            listing = getattr(registry.resolve(rec.spec), "known_models", None)
            names = listing() if listing is not None else []
        except Exception as exc:  # noqa: BLE001 - a family that cannot load is shown with its reason
            unavailable[rec.spec] = f"{type(exc).__name__}: {exc}"
            continue
        found.extend((rec.spec, known) for known in names)
    if as_json:
        click.echo(json.dumps({
            "schema_version": JSON_SCHEMA_VERSION,
            "models": [{"component": spec, "name": k.name, "file": k.file, "path": k.path} for spec, k in found],
            "unavailable": unavailable,
        }, indent=2))
        return
    rows = [[spec, k.name, k.path or f"missing: place {k.file} in ${MODEL_DIR_VARIABLE}"] for spec, k in found]
    if rows:
        click.echo(render_table(["Component", "Name", "On this machine"], rows))
    for spec, why in unavailable.items():
        click.echo(f"{spec}: cannot list its models ({why})", err=True)
    if not rows and not unavailable:
        click.echo("No installed model family resolves published models by name.")
