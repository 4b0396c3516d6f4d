"""The alchemi command: listings, JSON, strictness, and a cheap start."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from alchemi_core import __version__
from alchemi_core.cli import main
from alchemi_core.testing import FAKE_DISTS


def _alchemi(*args: str, fake: bool = False, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ)
    e.pop("ALCHEMI_STRICT_PLUGINS", None)
    if fake:
        e["PYTHONPATH"] = os.pathsep.join([str(FAKE_DISTS), e.get("PYTHONPATH", "")])
    e.update(env or {})
    cmd = [sys.executable, "-m", "alchemi_core.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=120)


def test_version_loads_no_plugin(monkeypatch):
    from alchemi_core import registry

    old = registry.use_manager(None)
    try:
        result = CliRunner().invoke(main, ["--version"])
        assert result.exit_code == 0 and result.output.strip() == f"alchemi {__version__}"
        assert registry._manager is None
    finally:
        registry.use_manager(old)


def test_help_lists_commands():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for cmd in ("list-plugins", "list-components", "new-plugin", "demo"):
        assert cmd in result.output


def test_list_plugins_json_with_a_broken_plugin_exits_zero():
    proc = _alchemi("list-plugins", "--json", "--all", fake=True)
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)
    assert payload["schema_version"] == 1
    plugins = {p["name"]: p for p in payload["plugins"]}
    assert plugins["fake-broken"]["status"] == "failed"
    assert "not_installed_anywhere" in plugins["fake-broken"]["error"]
    assert plugins["fake-good"]["status"] == "ok"
    assert "model:fake-good" in plugins["fake-good"]["provides"]
    assert plugins["alchemi-core"]["builtin"] is True


def test_strict_exits_one_when_a_plugin_failed():
    assert _alchemi("list-plugins", "--strict", fake=True).returncode == 1
    assert _alchemi("list-plugins", "--strict", fake=True,
                    env={"ALCHEMI_DISABLE_PLUGINS": "fake-broken,fake-unknown-hook"}).returncode == 0


def test_table_verbose_and_kind_filter():
    proc = _alchemi("list-plugins", "-v", "--all", "--kind", "model", fake=True)
    assert proc.returncode == 0
    out = proc.stdout
    assert "Plugin" in out and "Status" in out and "Provides" in out
    assert "model:fake-good" in out and "integrator:fake-good" not in out
    assert "entry point fake-broken = alchemi_fake_broken" in out
    assert "Traceback" in out


def test_list_components_table_and_json():
    runner = CliRunner()
    result = runner.invoke(main, ["list-components", "sink"])
    assert result.exit_code == 0 and "sink:host-memory" in result.output
    result = runner.invoke(main, ["list-components", "--json"])
    specs = {c["spec"] for c in json.loads(result.output)["components"]}
    assert "model:demo" in specs


def test_listing_imports_no_torch():
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "alchemi_core.cli", "list-plugins", "--all"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    heavy = {m for m in imported if m.split(".")[0] in ("torch", "warp", "zarr", "numpy")}
    assert not heavy, f"list-plugins imported {sorted(heavy)[:5]}"


def test_new_plugin_refuses_a_non_empty_folder(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep").write_text("")
    result = CliRunner().invoke(main, ["new-plugin", "alchemi-x", "--dest", str(tmp_path / "x")])
    assert result.exit_code != 0 and "not empty" in result.output


def test_list_components_of_an_unknown_kind_is_an_error_naming_the_kinds():
    result = CliRunner().invoke(main, ["list-components", "modle"])
    assert result.exit_code == 2
    assert "no components of kind 'modle'" in result.stderr and "did you mean 'model'" in result.stderr


def test_registry_build_passes_positional_arguments():
    from alchemi_core import registry

    sink = registry.build("sink:host-memory", 7)
    assert sink.capacity == 7


def test_a_plain_list_is_a_dataset_for_the_sampler():
    import torch

    from alchemi_core.data import AtomicData
    from alchemi_core.data.datapipes import Dataset
    from alchemi_core.dynamics import SizeAwareSampler

    ds = Dataset([AtomicData(atomic_numbers=[1] * n, positions=torch.zeros(n, 3)) for n in (2, 3, 4)])
    assert ds.get_all_metadata()[0].tolist() == [2, 3, 4]
    batch = SizeAwareSampler(ds, max_atoms=20).build_initial_batch()
    assert sorted(batch.num_nodes_list) == [2, 3, 4]


@pytest.mark.parametrize("kind, contract", [
    ("integrator", "IntegratorContract"), ("model", "ModelContract"), ("hook", "HookContract"),
])
def test_a_generated_plugin_passes_its_contract_tests_as_generated(tmp_path, kind, contract):
    """`alchemi new-plugin --kind KIND` writes a plugin whose own tests (its kind's contract
    included) pass untouched once it is installed; "installed" here is its sources on the path
    plus the entry point's metadata, which is all pip's editable install adds."""
    from pathlib import Path

    dest = tmp_path / "alchemi-fresh"
    result = CliRunner().invoke(main, ["new-plugin", "alchemi-fresh", "--kind", kind, "--dest", str(dest)])
    assert result.exit_code == 0, result.output
    tests = (dest / "tests" / "test_plugin.py").read_text()
    assert f"({contract})" in tests, f"the generated {kind} tests do not subclass {contract}"
    site = tmp_path / "site"
    info = site / "alchemi_fresh-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: alchemi-fresh\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[alchemi.plugins]\nfresh = alchemi_fresh.plugin\n")
    assert '[project.entry-points."alchemi.plugins"]\nfresh = "alchemi_fresh.plugin"' in (dest / "pyproject.toml").read_text()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(dest / "src"), os.environ.get("PYTHONPATH", "")]))
    env["ALCHEMI_STRICT_PLUGINS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
         "-W", "error::DeprecationWarning:alchemi_fresh", str(dest / "tests")],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout and "skipped" not in proc.stdout
    if kind == "integrator":
        assert Path(dest / "src" / "alchemi_fresh" / "integrator.py").read_text().count("self.context") >= 1
    listed = _alchemi("list-components", kind, env={"PYTHONPATH": env["PYTHONPATH"]})
    assert f"{kind}:fresh-" in listed.stdout, listed.stdout + listed.stderr


def test_new_plugin_of_an_unknown_kind_names_the_kinds(tmp_path):
    result = CliRunner().invoke(main, ["new-plugin", "alchemi-x", "--kind", "sink", "--dest", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "'sink' is not one of 'integrator', 'model', 'hook'" in result.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("kind", ["integrator", "model", "hook"])
def test_each_development_guide_names_what_its_template_generates(tmp_path, kind):
    """docs/dev/KIND.md generates `alchemi-my-KINDs`; every file and component it names is what
    `alchemi new-plugin --kind KIND` writes."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "dev" / f"{kind}.md").read_text()
    dist = f"alchemi-my-{kind}s"
    assert f"$ alchemi new-plugin {dist} --kind {kind}" in page
    dest = tmp_path / dist
    assert CliRunner().invoke(main, ["new-plugin", dist, "--kind", kind, "--dest", str(dest)]).exit_code == 0
    named = set(re.findall(r"`((?:src|tests)/[\w/]+\.py)`", page))
    assert named, f"docs/dev/{kind}.md names none of its template's files"
    for rel in named:
        assert (dest / rel).is_file(), f"docs/dev/{kind}.md names {rel}, which the {kind} template does not write"
    spec = re.search(rf"`({kind}:my-{kind}s-[\w-]+)`", page)
    assert spec and f'"{spec.group(1).split(":", 1)[1]}"' in (dest / "src" / dist.replace("-", "_") / "plugin.py").read_text()
    defined = set(re.findall(r"^(?:class|def) (\w+)", "".join(p.read_text() for p in (dest / "src").rglob("*.py")), re.M))
    for name in re.findall(r"\| `src/[\w/]+\.py` \| `(\w+)`", page):
        assert name in defined, f"docs/dev/{kind}.md names {name}; the template defines {sorted(defined)}"
