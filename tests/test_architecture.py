"""The layout rules the code keeps: no import circles, short engine modules, no private access.

An import circle (module A imports B, which imports A again, directly or through others; imports
inside functions count, those under ``if TYPE_CHECKING:`` do not) makes its modules one knot
that cannot be read, tested or changed alone. The engine's modules stay short so each holds one
idea, and plugins read the engine only through public names (the ``StepContext`` above all).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from alchemi_core.testing.imports import import_circles, import_graph, strongly_connected

ROOT = Path(__file__).resolve().parents[1]
#: Longest module of ``alchemi_core/dynamics`` (lines), "about 400".
MAX_ENGINE_MODULE_LINES = 420


def packages() -> list[tuple[str, Path]]:
    """``alchemi_core`` and every plugin's package under ``plugins/*/src``."""
    found = [("alchemi_core", ROOT / "alchemi_core")]
    for init in sorted(ROOT.glob("plugins/*/src/*/__init__.py")):
        found.append((init.parent.name, init.parent))
    return found


@pytest.mark.parametrize(("name", "root"), packages(), ids=[n for n, _ in packages()])
def test_no_import_circle(name, root):
    circles = import_circles(root, name)
    assert not circles, (
        f"{name} has import circles (imports inside functions count): "
        + "; ".join(" <-> ".join(c) for c in circles)
        + ". Move what both sides need into a module that imports neither."
    )


def test_the_circle_finder_finds_circles(tmp_path):
    pkg = tmp_path / "knot"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from knot.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from knot import a\n")  # inside a function: counts
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from knot import a\n")
    (pkg / "d.py").write_text("from . import c\n")
    assert import_circles(pkg, "knot") == [["knot.a", "knot.b"]]
    graph = import_graph(pkg, "knot")
    assert graph["knot.c"] == set()  # type-checking imports never run
    assert graph["knot.d"] == {"knot.c"}  # relative imports resolve
    assert strongly_connected({"x": {"y"}, "y": {"x"}, "z": {"x"}}) == [["x", "y"]]


def test_engine_modules_are_short():
    long = {
        p.name: n
        for p in sorted((ROOT / "alchemi_core" / "dynamics").rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_ENGINE_MODULE_LINES
    }
    assert not long, f"alchemi_core/dynamics modules over {MAX_ENGINE_MODULE_LINES} lines: {long}; split them by idea"


def _private_reads(path: Path) -> list[str]:
    """``x._engine``-style reads of a core object's private attribute in a plugin's source."""
    core_private = {"_engine", "_pipeline_rank", "_graph", "_attach", "_update_masks", "_attach_owner"}
    hits = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in core_private:
            hits.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
        if (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in core_private
        ):
            hits.append(f"{path.relative_to(ROOT)}:{node.lineno} getattr(..., {node.args[1].value!r})")
    return hits


def test_plugins_read_no_private_attribute_of_the_engine():
    hits = [h for p in sorted(ROOT.glob("plugins/*/src/**/*.py")) for h in _private_reads(p)]
    assert not hits, "plugins read private attributes of core objects (use the StepContext): " + ", ".join(hits)


#: The one Warp runtime: its launches, streams and recordings.
RUNTIME = ("warp_runtime.py", "warp_recordings.py")


def test_warp_launches_go_through_the_one_runtime():
    """Stream wrappers and recorded launches exist once, in ``alchemi_core.warp_runtime`` (and the
    recordings it makes from earlier ones, ``alchemi_core.warp_recordings``)."""
    owners = []
    for path in sorted([*ROOT.glob("plugins/*/src/**/*.py"), *ROOT.glob("alchemi_core/**/*.py")]):
        text = path.read_text(encoding="utf-8")
        if path.name not in RUNTIME and ("stream_from_torch" in text or "record_cmd=True" in text):
            owners.append(str(path.relative_to(ROOT)))
    assert not owners, f"Warp stream caches or launch recording outside alchemi_core.warp_runtime: {owners}"


def test_core_imports_no_plugin():
    """Core reaches plugins through the registry (components and public names), never by import:
    a plugin can then be replaced, disabled or missing without core breaking at import."""
    plugins = {init.parent.name for init in ROOT.glob("plugins/*/src/*/__init__.py")}
    found = []
    for path in sorted((ROOT / "alchemi_core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                      if n.split(".")[0] in plugins]
    assert not found, "core imports plugins by name (use registry.resolve / resolve_export): " + "; ".join(found)
