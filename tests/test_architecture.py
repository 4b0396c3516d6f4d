"""The layout rules the code keeps: no import circles, short engine modules, no private access.

An import circle (module A imports B, which imports A again, directly or through others; imports
inside functions count, those under ``if TYPE_CHECKING:`` do not) makes its modules one knot
that cannot be read, tested or changed alone. The engine's modules stay short so each holds one
idea, and plugins read the engine only through public names (the ``StepContext`` above all).
"""

from __future__ import annotations

import ast
import importlib.util
import re
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
RUNTIME = ("warp_runtime.py",)


def test_warp_launches_go_through_the_one_runtime():
    """Stream wrappers and recorded launches exist once, in ``alchemi_core.warp_runtime``."""
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


#: Warp's public names only: a name that begins with one underscore (``wp._src``, a kernel's
#: ``_invoke_cache``, an array's ``_tensor``) may change in any release.
WARP_MODULE = "warp"
_WARP_PATH = re.compile(r"\bwarp(\.\w+)*\._(?!_)")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _root(node: ast.AST) -> ast.AST:
    """The expression an attribute chain starts from (through calls and subscripts)."""
    while True:
        if isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        else:
            return node


def _is_warp_call(node: ast.AST) -> bool:
    """``warp()`` or ``x.warp()``: the runtime's handle on the ``warp`` module."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Name) and f.id == WARP_MODULE) or (isinstance(f, ast.Attribute) and f.attr == WARP_MODULE)


def private_warp_uses(source: str, where: str = "<source>") -> list[str]:
    """Uses of a private Warp name in ``source``: an attribute beginning with ``_`` (not a dunder)
    anywhere in a chain that starts from Warp (``wp``, ``warp``, an alias imported from Warp,
    ``warp()``, or a name assigned from such a chain: ``a = wp.array(...)``), ``getattr`` of such
    a name, imports of one (``from warp._src import x``, ``from warp import _x``), and module
    paths in strings (``sys.modules["warp._src.context"]``)."""
    tree = ast.parse(source)
    roots = {WARP_MODULE, "wp"}
    hits: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == WARP_MODULE:
                    roots.add(alias.asname or WARP_MODULE)
                    if any(_private(part) for part in alias.name.split(".")):
                        hits.append(f"{where}:{node.lineno} import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == WARP_MODULE and not node.level:
            for alias in node.names:
                roots.add(alias.asname or alias.name)
                if any(_private(part) for part in [*(node.module or "").split("."), alias.name]):
                    hits.append(f"{where}:{node.lineno} from {node.module} import {alias.name}")

    def from_warp(expr: ast.AST) -> bool:
        base = _root(expr)
        return (isinstance(base, ast.Name) and base.id in roots) or _is_warp_call(base) or _is_warp_call(expr)

    # Names bound to something of Warp's, until no more are found (``a = wp.array(...); b = a``).
    grew = True
    while grew:
        grew = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and from_warp(node.value):
                for target in node.targets:  # names only: ``self.x = warp()`` binds no ``self``
                    for name in target.elts if isinstance(target, ast.Tuple | ast.List) else [target]:
                        if isinstance(name, ast.Name) and name.id not in roots:
                            roots.add(name.id)
                            grew = True
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and from_warp(node.value):
            hits.append(f"{where}:{node.lineno} .{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr",
              "hasattr") and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and _private(node.args[1].value) and from_warp(node.args[0])):
            hits.append(f"{where}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _WARP_PATH.search(node.value):
            hits.append(f"{where}:{node.lineno} {node.value!r}")
    return hits


def _private_members(tree: ast.AST, only_own: bool) -> set[str]:
    """Private names a module gives its objects: methods and class attributes, and attributes set
    on anything (``x._y = ...``), or with ``only_own`` set on ``self`` and ``cls`` only."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(item.name)
                for target in targets:
                    if isinstance(target, ast.Name):
                        names.add(target.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if not only_own or (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                names.add(node.attr)
    return {n for n in names if _private(n)}


def warp_private_members(product: dict[str, ast.AST]) -> set[str]:
    """Private members of Warp's objects (a kernel's ``_invoke_cache``, a vector type's
    ``_length_``) that alchemi's own classes do not also define: reading one of these names on any
    object means reading Warp's internals, which a chain from ``wp`` alone does not show."""
    spec = importlib.util.find_spec(WARP_MODULE)
    if spec is None or spec.origin is None:
        pytest.skip("needs warp-lang")
    warp_names: set[str] = set()
    for path in Path(spec.origin).parent.rglob("*.py"):
        if {"tests", "examples"} & set(path.parts):
            continue  # Warp's own tests and examples define nothing of its objects
        warp_names |= _private_members(ast.parse(path.read_text(encoding="utf-8")), only_own=False)
    ours = set().union(*(_private_members(tree, only_own=True) for tree in product.values()))
    return warp_names - ours


def test_product_code_uses_only_public_warp_names():
    """Private Warp names break on a Warp upgrade; the public API does all alchemi needs."""
    product = {
        str(p.relative_to(ROOT)): ast.parse(p.read_text(encoding="utf-8"))
        for p in sorted([*ROOT.glob("alchemi_core/**/*.py"), *ROOT.glob("plugins/*/src/**/*.py")])
    }
    hits = [h for where in product for h in private_warp_uses((ROOT / where).read_text(encoding="utf-8"), where)]
    members = warp_private_members(product)
    for where, tree in product.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in members:
                hits.append(f"{where}:{node.lineno} .{node.attr}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) >= 2
                  and isinstance(node.args[1], ast.Constant) and node.args[1].value in members):
                hits.append(f"{where}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})")
    assert not hits, "private Warp names (use Warp's public API): " + ", ".join(sorted(set(hits)))


def test_the_private_warp_finder_finds_them():
    found = private_warp_uses(
        "import warp as wp\n"
        "import warp._src.context as ctx\n"  # 2
        "from warp._src.types import array\n"  # 3
        "from warp import _x\n"  # 4
        "a = wp.array(ptr=0, dtype=wp.float32, shape=(1,))\n"
        "a._tensor = 1\n"  # 6: a name bound to Warp's
        "wp.context.runtime._cuda = 1\n"  # 7
        "k = wp.kernel(f).module\n"
        "k._invoke_cache.get(1)\n"  # 9
        "def f(runtime):\n"
        "    w = runtime.warp()\n"
        "    return w._src, getattr(wp, '_y'), sys.modules.get('warp._src.context')\n"  # 12, three times
        "ok = (wp.__version__, wp.launch, _warp._private, wp.float32(1.0)._type_ if False else 0)\n"  # 13: one
    )
    lines = sorted(int(h.split(":")[1].split()[0]) for h in found)
    assert lines == [2, 3, 4, 6, 7, 9, 12, 12, 12, 13], found
    assert private_warp_uses("from alchemi_potentials import _warp\nx = _warp.view(t)._held\n") == []
