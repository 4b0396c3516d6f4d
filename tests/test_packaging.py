"""Every distribution installs without warnings about its metadata, and the umbrella `alchemi`
installs core and every first-party plugin."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from alchemi_core.plugin import first_party

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECTS = sorted(
    p for p in ROOT.glob("**/pyproject.toml") if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
)


def _load(path: Path) -> dict:
    return tomllib.loads(path.read_text())


@pytest.mark.parametrize("path", PYPROJECTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_metadata_is_spdx_with_classifiers(path):
    meta = _load(path)
    project = meta["project"]
    assert project.get("license") == "Apache-2.0", f"{path}: use license = \"Apache-2.0\" (an SPDX expression)"
    requires = meta["build-system"]["requires"]
    assert any(r.replace(" ", "").startswith("setuptools>=77") for r in requires), (
        f"{path}: an SPDX license string needs setuptools>=77 in build-system.requires"
    )
    assert any(c.startswith("Topic :: Scientific/Engineering") for c in project.get("classifiers", ())), path


def test_the_repository_has_its_license():
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()


def test_the_umbrella_installs_core_and_every_first_party_plugin():
    project = _load(ROOT / "distributions" / "alchemi" / "pyproject.toml")["project"]
    names = {d.split("[")[0].split("=")[0].split(">")[0].strip() for d in project["dependencies"]}
    assert names == {"alchemi-core", *first_party.in_env("main")}
    extras = project["optional-dependencies"]
    assert "mace" in extras and "sevennet" in extras
    # Plugins with environments of their own come as extras (their dependencies conflict).
    in_extras = {d.split("[")[0].split("=")[0].strip() for deps in extras.values() for d in deps}
    others = {p.distribution for p in first_party.PLUGINS if p.env != "main"}
    assert others <= in_extras, f"first-party plugins missing from the umbrella's extras: {sorted(others - in_extras)}"


def test_core_lists_every_folder_it_ships():
    """alchemi-core lists its packages explicitly: a folder of code or templates left out of the
    list breaks `pip install` (an editable install of an older list hides it)."""
    listed = set(_load(ROOT / "pyproject.toml")["tool"]["setuptools"]["packages"])
    folders = {
        ".".join(f.parent.relative_to(ROOT).parts)
        for f in (ROOT / "alchemi_core").rglob("*")
        if f.is_file() and f.suffix in (".py", ".tmpl") and "__pycache__" not in f.parts
        and "fake_dists" not in f.parts
    }
    assert not folders - listed, f"pyproject.toml's [tool.setuptools] packages lacks {sorted(folders - listed)}"
    gone = {p for p in listed if not (ROOT / p.replace(".", "/")).is_dir()}
    assert not gone, f"pyproject.toml's [tool.setuptools] packages names folders that do not exist: {sorted(gone)}"
