"""``alchemi new-plugin``: a working third-party plugin package to start from."""

from __future__ import annotations

import re
from pathlib import Path

import click

TEMPLATES = Path(__file__).parent / "templates"


def names(dist: str) -> dict[str, str]:
    """Distribution, package and short (entry-point) names for a plugin called ``dist``."""
    if not re.fullmatch(r"[a-z][a-z0-9-]*[a-z0-9]", dist):
        raise click.BadParameter("use lower-case letters, digits and '-', e.g. alchemi-my-integrators")
    short = dist[len("alchemi-") :] if dist.startswith("alchemi-") else dist
    return {"@@DIST@@": dist, "@@PKG@@": dist.replace("-", "_"), "@@SHORT@@": short}


def render(dist: str, dest: Path) -> list[Path]:
    """Write the plugin package for ``dist`` under ``dest``; returns the files written."""
    subst = names(dist)
    written = []
    for tmpl in sorted(TEMPLATES.rglob("*")):
        if tmpl.is_dir():
            continue
        rel = str(tmpl.relative_to(TEMPLATES)).replace("PKG", subst["@@PKG@@"])
        rel = rel[: -len(".tmpl")] if rel.endswith(".tmpl") else rel
        text = tmpl.read_text()
        for key, value in subst.items():
            text = text.replace(key, value)
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        written.append(out)
    typed = dest / "src" / subst["@@PKG@@"] / "py.typed"
    typed.write_text("")
    written.append(typed)
    return written


@click.command("new-plugin")
@click.argument("name")
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder to create (default: ./NAME).")
@click.option("--force", is_flag=True, help="Write into an existing folder.")
def new_plugin(name: str, dest: Path | None, force: bool) -> None:
    """Create a plugin package NAME (e.g. alchemi-my-integrators) with one integrator, its
    entry point and contract tests."""
    target = dest or Path(name)
    if target.exists() and any(target.iterdir()) and not force:
        raise click.ClickException(f"{target} exists and is not empty; pass --force to write into it")
    files = render(name, target)
    click.echo(f"created {len(files)} files in {target}; next: pip install -e {target} && alchemi list-plugins")
