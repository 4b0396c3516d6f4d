"""``alchemi new-plugin``: a working third-party plugin package to start from.

Each kind of plugin (an integrator, a model, a hook) has a folder of templates under
``templates/``; ``templates/common`` holds the files every kind shares (``pyproject.toml`` with
the entry point, the package's ``__init__``). ``@@NAME@@`` placeholders in file contents and
``PKG`` in paths are replaced by :func:`names`.

Example:
    >>> sorted(KINDS)
    ['hook', 'integrator', 'model']
    >>> names("alchemi-my-models", "model")["@@SPEC@@"]
    'model:my-models-morse'
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import click

TEMPLATES = Path(__file__).parent / "templates"


@attrs.frozen
class Kind:
    """What one kind of generated plugin adds.

    Attributes:
        suffix: The component's name after the plugin's short name (``<short>-<suffix>``).
        about: What the component is, for the package's description.
    """

    suffix: str
    about: str


#: The kinds of plugin ``alchemi new-plugin --kind`` writes; each has a folder under ``templates/``.
KINDS: dict[str, Kind] = {
    "integrator": Kind("euler", "a symplectic Euler integrator"),
    "model": Kind("morse", "a Morse pair potential with forces and stress by autograd"),
    "hook": Kind("max-force", "a hook recording each system's largest force every N steps"),
}


def names(dist: str, kind: str = "integrator") -> dict[str, str]:
    """The placeholders of the ``kind`` templates for a plugin called ``dist``: distribution,
    package and short (entry-point) names, the component's name and spec, and its description."""
    if not re.fullmatch(r"[a-z][a-z0-9-]*[a-z0-9]", dist):
        raise click.BadParameter("use lower-case letters, digits and '-', e.g. alchemi-my-integrators")
    short = dist[len("alchemi-") :] if dist.startswith("alchemi-") else dist
    component = f"{short}-{KINDS[kind].suffix}"
    return {
        "@@DIST@@": dist, "@@PKG@@": dist.replace("-", "_"), "@@SHORT@@": short,
        "@@COMPONENT@@": component, "@@SPEC@@": f"{kind}:{component}", "@@ABOUT@@": KINDS[kind].about,
    }


def render(dist: str, dest: Path, kind: str = "integrator") -> list[Path]:
    """Write the ``kind`` plugin package for ``dist`` under ``dest``; returns the files written."""
    if kind not in KINDS:
        raise click.BadParameter(f"unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    subst = names(dist, kind)
    written = []
    for root in (TEMPLATES / "common", TEMPLATES / kind):
        for tmpl in sorted(root.rglob("*")):
            if tmpl.is_dir():
                continue
            rel = str(tmpl.relative_to(root)).replace("PKG", subst["@@PKG@@"])
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
@click.option("--kind", type=click.Choice(list(KINDS)), default="integrator", show_default=True,
              help="What the plugin adds: an integrator, a model or a hook.")
@click.option("--dest", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder to create (default: ./NAME).")
@click.option("--force", is_flag=True, help="Write into an existing folder.")
def new_plugin(name: str, kind: str, dest: Path | None, force: bool) -> None:
    """Create a plugin package NAME (e.g. alchemi-my-integrators) with one integrator, model or
    hook (--kind), its entry point and its contract tests."""
    target = dest or Path(name)
    if target.exists() and any(target.iterdir()) and not force:
        raise click.ClickException(f"{target} exists and is not empty; pass --force to write into it")
    files = render(name, target, kind)
    click.echo(f"created {len(files)} files in {target}; next: pip install -e {target} && alchemi list-plugins")
