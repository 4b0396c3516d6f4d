"""The first-party plugin list (``alchemi_core.plugin.first_party``) is the one truth: the
``plugins/`` folders, ``scripts/dev``, ``tox.ini``, the README's table, the registry's install
hints and what each installed plugin registers all agree with it."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from pathlib import Path

import pytest

from alchemi_core import registry
from alchemi_core.plugin import first_party

ROOT = Path(__file__).resolve().parents[1]
NAMES = {p.distribution for p in first_party.PLUGINS}


def test_every_plugin_folder_is_listed_and_every_listed_plugin_has_a_folder():
    folders = {p.parent.name for p in ROOT.glob("plugins/alchemi-*/pyproject.toml")}
    assert folders == NAMES, (
        f"plugins/ has {sorted(folders - NAMES)} not in first_party.PLUGINS; listed without a folder: "
        f"{sorted(NAMES - folders)}"
    )


def test_the_list_runs_without_alchemi_installed():
    """scripts/dev reads it with the system's Python before any environment exists."""
    path = ROOT / "alchemi_core" / "plugin" / "first_party.py"
    out = subprocess.run([sys.executable, "-S", "-I", str(path), "main"], capture_output=True, text=True, check=True)
    assert out.stdout.split() == first_party.in_env("main")


def test_an_environment_says_which_python_it_is_made_with():
    """scripts/dev makes .venv-torchsim with Python 3.12 (torch-sim-atomistic needs it)."""
    path = ROOT / "alchemi_core" / "plugin" / "first_party.py"
    for env in first_party.other_envs():
        out = subprocess.run([sys.executable, "-S", "-I", str(path), "--python", env], capture_output=True, text=True,
                             check=True)
        assert out.stdout.strip() == first_party.python_of(env)
    assert first_party.python_of("torchsim") == "3.12" and first_party.python_of("mace") == ""
    assert '"$first_party" --python' in (ROOT / "scripts" / "dev").read_text()


def test_scripts_dev_takes_its_plugins_from_the_list():
    text = (ROOT / "scripts" / "dev").read_text()
    assert 'first_party="alchemi_core/plugin/first_party.py"' in text
    assert '"$first_party" main' in text and '"$first_party" --envs' in text
    assert not re.search(r"(plugins|mlip)=\(", text), "scripts/dev must not keep its own plugin list"


def test_tox_has_one_env_per_main_plugin():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "tox.ini")
    factors = re.search(r"alchemi-\{([^}]*)\}", cfg["tox"]["envlist"])
    assert factors is not None, "tox.ini's envlist lost its alchemi-{...} factor"
    listed = {f"alchemi-{f.strip()}" for f in factors.group(1).split(",")}
    assert listed == set(first_party.in_env("main"))
    section = next(s for s in cfg.sections() if s.startswith("testenv:alchemi-{"))
    assert {f"alchemi-{f.strip()}" for f in section[len("testenv:alchemi-{") : -1].split(",")} == listed


def test_the_readme_table_lists_every_plugin_as_the_list_says():
    text = (ROOT / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(alchemi-[a-z0-9-]+)` \| (.*) \|$", text, flags=re.M))
    assert set(rows) == NAMES, f"README table: {sorted(set(rows) ^ NAMES)} differ from first_party.PLUGINS"
    for p in first_party.PLUGINS:
        assert rows[p.distribution] == p.summary, f"README's line for {p.distribution} differs from its summary"


def test_installed_plugins_register_what_the_list_says():
    pm = registry.manager()
    provided: dict[str, set[str]] = {}
    for spec, recs in [*pm.components.items(), *pm.exports.items()]:
        for rec in recs:
            dist = pm.records[rec.plugin].distribution
            provided.setdefault(dist, set()).add(spec)
    checked = 0
    for p in first_party.PLUGINS:
        if p.distribution in provided:
            assert provided[p.distribution] == set(p.provides), p.distribution
            checked += 1
    if not checked:
        pytest.skip("no first-party plugin is installed")


@pytest.mark.parametrize(
    ("module", "name", "dist"),
    [
        ("alchemi_core.dynamics", "Langevin", "alchemi-integrators"),
        ("alchemi_core.dynamics", "GPUBuffer", "alchemi-warp"),
        ("alchemi_core.dynamics.hooks", "LoggingHook", "alchemi-hooks"),
        ("alchemi_core.dynamics", "ZarrData", "alchemi-zarr"),
    ],
)
def test_a_missing_plugin_name_gives_its_install_hint(isolated_registry, module, name, dist):
    with pytest.raises(ImportError, match=f"pip install {dist}"):
        registry.resolve_export(module, name)
