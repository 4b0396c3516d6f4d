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


# ---------------------------------------------------------------------------- no module-level switches
# Per-device choices live in each plugin's frozen ``Tuning`` (``alchemi_core.tuning``), passed to the
# components that use them; a module global that is reassigned or mutated after import is a switch
# every caller shares (a test or a benchmark that changes it changes it for everything after).

#: Calls that build a mutable container.
_MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque", "bytearray"}
#: Methods that change a container in place.
_MUTATORS = {"update", "append", "extend", "insert", "pop", "popitem", "clear", "setdefault", "add", "discard",
             "remove", "__setitem__"}

#: Module-level mutable containers in product code that are not switches: caches and registries the
#: code fills itself, keyed by what they hold, never read as a choice. Each says what it holds.
ALLOWED_MUTABLE_GLOBALS: dict[str, str] = {
    "alchemi_core.data.fields:_registered": "registry: the levels of fields that plugins register",
    "alchemi_core.dynamics.build_pool:global _DATASET": "a build worker process's dataset, set once at its start",
    "alchemi_core.dynamics.capture:_spares": "cache: captured CUDA graphs of ended runs kept for reuse, per GPU",
    "alchemi_core.dynamics.composition:_BUILDERS": "registry: what each stage operator builds, filled at import",
    "alchemi_core.models.base:_species_tables": "cache: device tables of the species models take",
    "alchemi_core.registry:global _manager": "the plugin manager, made at first use",
    "alchemi_core.warp_runtime:_devices": "cache: Warp devices by torch device",
    "alchemi_core.warp_runtime:_streams": "cache: Warp streams of torch streams",
    "alchemi_core.warp_runtime:_view_kinds": "cache: Warp dtypes of torch dtypes",
    "alchemi_core.warp_runtime:global _wp": "the warp module, imported at first use",
    "alchemi_warp.buffer_ops:_zero_words": "cache: a zero word per device and dtype",
    "alchemi_zarr.chunks:_WARNED": "the warnings given once per process",
    "alchemi_zarr.local_files:global _executor": "the file writers' thread pool, made at first use",
    "alchemi_zarr.local_files:global _executor_key": "the process and size that pool was made for",
    "alchemi_zarr.stores:_process_locks": "registry: one lock per store path in this process",
}

#: Module constants (not per-device choices) that tests shrink so that a path made for large
#: inputs runs on small ones; each is read where it is used. ``module:NAME``.
ALLOWED_PATCHED_CONSTANTS: dict[str, str] = {
    "alchemi_potentials.pair_potential:DIRECT_TOTALS_UP_TO": "systems from this size fold per-slot totals",
    "alchemi_potentials.pair_potential:FOLD_CHUNK": "slots per chunk of that fold",
    "alchemi_zarr.layout:CHUNK_BYTES": "bytes per zarr chunk (tools/store_append.py measures sizes)",
    "alchemi_zarr.chunks:LOCAL_FILES": "tools/store_append.py: local files written by threads or zarr",
    "alchemi_zarr.local_files:FILE_THREADS": "tools/store_append.py: threads of those writes",
    "alchemi_zarr.chunks:_WARNED": "test_chunks.py clears the once-per-process warnings",
}


def _product_files() -> list[Path]:
    files = sorted((ROOT / "alchemi_core").rglob("*.py"))
    for src in sorted(ROOT.glob("plugins/*/src")):
        files += sorted(src.rglob("*.py"))
    return files


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = list(rel.parts[3:] if rel.parts[0] == "plugins" else rel.parts)
    parts[-1] = parts[-1][:-3]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _product_modules() -> set[str]:
    return {_module_name(p) for p in _product_files()}


def _is_mutable(value: ast.expr | None) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return name in _MUTABLE_CALLS
    return False


def _written(node: ast.AST) -> list[ast.expr]:
    """What an assignment, augmented assignment or ``del`` writes (tuples unpacked)."""
    if isinstance(node, ast.Assign):
        return [t for t in node.targets for t in (t.elts if isinstance(t, ast.Tuple) else [t])]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    return list(node.targets) if isinstance(node, ast.Delete) else []


def _device_keyed(value: ast.expr | None) -> bool:
    """A dict literal keyed by device types: the shape of a per-device switch."""
    return isinstance(value, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value in ("cpu", "cuda") for k in value.keys)


def mutable_globals(source: str, module: str) -> list[str]:
    """``module:NAME`` of each module global that is a switch: bound at module level (also inside
    a module-level ``if``/``try``) to a mutable container that the module itself changes after
    import (``NAME[k] = v``, ``NAME.update(...)``, ``del NAME[k]``, a ``global NAME`` rebinding it),
    or to a dict keyed by device types; and ``module:global NAME`` of each ``global`` statement.
    (A constant table the module never changes is not a switch, whatever its type.)"""
    tree = ast.parse(source)
    containers: dict[str, bool] = {}  # name -> device-keyed
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.If, ast.Try)):
            todo.extend(node.body + node.orelse + getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                todo.extend(handler.body)
            continue
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        else:
            continue
        if _is_mutable(value):
            for t in targets:
                if isinstance(t, ast.Name):
                    containers[t.id] = containers.get(t.id, False) or _device_keyed(value)
    changed: set[str] = set()
    rebound: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            rebound += node.names
        for t in _written(node):
            while isinstance(t, (ast.Subscript, ast.Attribute)):
                t = t.value
                if isinstance(t, ast.Name):
                    changed.add(t.id)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS \
                and isinstance(node.func.value, ast.Name):
            changed.add(node.func.value.id)
    found = [f"{module}:{name}" for name, by_device in containers.items()
             if by_device or name in changed or name in rebound]
    return found + [f"{module}:global {name}" for name in rebound]


def _module_aliases(tree: ast.AST, product: set[str]) -> dict[str, str]:
    """Local name -> product module, for the imports of a file that bind a module."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in product:
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in product:
                    aliases[a.asname or a.name] = full
    return aliases


def _switch_name(name: str) -> bool:
    """A module constant's name (``SKIN``, ``_WARNED``), not a function's or a class's."""
    return name.strip("_").isupper()


def patched_globals(source: str, product: set[str]) -> list[tuple[int, str]]:
    """``(line, "module:NAME")`` of each assignment to, or mutation of, a product module's
    constant: ``mod.NAME = ...``, ``mod.NAME[k] = ...``, ``mod.NAME.update(...)``,
    ``monkeypatch.setattr(mod, "NAME", ...)``, ``monkeypatch.setitem(mod.NAME, ...)``,
    ``setattr(mod, "NAME", ...)``. Functions patched with test doubles are not switches."""
    tree = ast.parse(source)
    aliases = _module_aliases(tree, product)

    def module_attr(node: ast.expr) -> str | None:
        """``module:NAME`` for ``alias.NAME`` (also ``alias.NAME[...]``, ``alias.NAME.x``)."""
        while isinstance(node, ast.Subscript) or (isinstance(node, ast.Attribute)
                                                  and not isinstance(node.value, ast.Name)):
            node = node.value
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            return f"{aliases[node.value.id]}:{node.attr}"
        return None

    hits = []
    for node in ast.walk(tree):
        for t in _written(node):
            if isinstance(t, (ast.Attribute, ast.Subscript)) and (name := module_attr(t)):
                hits.append((node.lineno, name))
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        method = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if method == "setattr" and len(node.args) >= 2 and isinstance(node.args[0], ast.Name) \
                and node.args[0].id in aliases and isinstance(node.args[1], ast.Constant):
            hits.append((node.lineno, f"{aliases[node.args[0].id]}:{node.args[1].value}"))
            continue
        # monkeypatch.setitem(mod.NAME, ...), or mod.NAME.update(...): the container changed.
        changed = (node.args[0] if method in ("setitem", "delitem") and node.args
                   else func.value if method in _MUTATORS and isinstance(func, ast.Attribute) else None)
        if changed is not None and (name := module_attr(changed)):
            hits.append((node.lineno, name))
    return sorted((line, name) for line, name in hits if _switch_name(name.split(":")[1]))


def _repo_python_files() -> list[Path]:
    # Hidden folders hold environments (.venv, .venv-mace, ...), caches and git's own files.
    skip = {"node_modules", "build", "dist"}
    return [p for p in sorted(ROOT.rglob("*.py"))
            if not any(part.startswith(".") or part in skip for part in p.relative_to(ROOT).parts)]


def test_product_code_has_no_module_level_mutable_state():
    found = []
    for path in _product_files():
        found += mutable_globals(path.read_text(encoding="utf-8"), _module_name(path))
    allowed = set(ALLOWED_MUTABLE_GLOBALS)
    bad = sorted(set(found) - allowed)
    assert not bad, (
        f"module-level mutable state in product code: {bad}. A per-device choice belongs in the plugin's "
        "frozen Tuning (alchemi_core.tuning), passed to the component; a constant table is a tuple, a "
        "frozenset or a MappingProxyType; a genuine cache or registry goes in ALLOWED_MUTABLE_GLOBALS with "
        "what it holds"
    )
    stale = sorted(set(ALLOWED_MUTABLE_GLOBALS) - set(found))
    assert not stale, f"ALLOWED_MUTABLE_GLOBALS names what no longer exists: {stale}; remove it"


def test_nothing_assigns_to_a_product_modules_constants():
    """Tests, benchmarks and tools pass a Tuning (or an argument) instead of patching a module."""
    product = _product_modules()
    allowed = set(ALLOWED_PATCHED_CONSTANTS)
    bad = []
    for path in _repo_python_files():
        for line, name in patched_globals(path.read_text(encoding="utf-8"), product):
            if name not in allowed:
                bad.append(f"{path.relative_to(ROOT)}:{line} {name}")
    assert not bad, (
        f"assignments to product modules' constants: {bad}. Pass the component a Tuning "
        "(attrs.evolve(PotentialsTuning.for_device('cpu'), skin=0.7)) or an argument instead"
    )


def test_the_switch_finders_find_switches():
    product = {"pkg", "pkg.layout", "pkg.step"}
    module = (
        "import types\nfrom collections import defaultdict\n"
        "SKIN = {'cuda': 1.0}\nORDER: list[str] = []\nBY = defaultdict(int)\n"
        "FIXED = types.MappingProxyType({'cuda': 1.0})\nNAMES = ('a', 'b')\n"
        "TABLE = {'a': 1}\n"  # never changed: a constant
        "if True:\n    LATE = set()\n"
        "def f():\n    global COUNT\n    local = {}\n    local['x'] = 1\n    ORDER.append(1)\n"
        "    BY['x'] += 1\n    LATE.add(2)\n"
    )
    assert mutable_globals(module, "pkg.m") == ["pkg.m:SKIN", "pkg.m:ORDER", "pkg.m:BY", "pkg.m:LATE",
                                                "pkg.m:global COUNT"]
    patches = (
        "from pkg import layout\nimport pkg.step as step\nimport other\n"
        "layout.SKIN['cpu'] = 0.7\n"
        "monkeypatch.setattr(layout, 'SKIN', {})\n"
        "monkeypatch.setitem(step.RUN_AHEAD, 'cpu', True)\n"
        "step.RUN_AHEAD.update(cpu=True)\n"
        "layout.FORCED = 3\n"
        "monkeypatch.setattr(layout, 'search_parts', lambda *a: 1)\n"  # a test double: allowed
        "other.SKIN['cpu'] = 1\n"  # not a product module
        "x = layout.SKIN['cpu']\n"  # a read
    )
    assert patched_globals(patches, product) == [
        (4, "pkg.layout:SKIN"), (5, "pkg.layout:SKIN"), (6, "pkg.step:RUN_AHEAD"), (7, "pkg.step:RUN_AHEAD"),
        (8, "pkg.layout:FORCED"),
    ]


#: Engine classes that other engine classes may subclass: the public extension bases.
ENGINE_BASES = {
    "alchemi_core.dynamics.base.BaseDynamics": "integrators subclass it (DemoDynamics here)",
    "alchemi_core.dynamics.hook.Hook": "hooks subclass it (ConvergenceHook here)",
    "alchemi_core.dynamics.sinks.DataSink": "the sink interface (HostMemory here)",
}


def engine_subclasses(root: Path, package: str, allowed: set[str] = frozenset()) -> list[str]:
    """``module.Class inherits module.Base`` for each class under ``root`` (the package
    ``package``) whose base is another class defined there, other than those in ``allowed``;
    bases are followed through imports and re-exports."""
    modules: dict[str, ast.Module] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules[name] = ast.parse(path.read_text(encoding="utf-8"))
        modules[name].is_package = is_package  # type: ignore[attr-defined]
    defined = {f"{m}.{n.name}" for m, tree in modules.items() for n in tree.body if isinstance(n, ast.ClassDef)}
    names: dict[str, dict[str, str]] = {}  # per module: local name -> what it stands for
    for module, tree in modules.items():
        local = names[module] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:  # relative: from the module's package, up level - 1 packages
                    here = module.split(".")
                    up = here[: len(here) - node.level + int(tree.is_package)]  # type: ignore[attr-defined]
                    source = ".".join([*up, source] if source else up)
                for alias in node.names:
                    local[alias.asname or alias.name] = f"{source}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    top = alias.name.split(".")[0]
                    local[alias.asname or top] = alias.name if alias.asname else top
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                local[node.name] = f"{module}.{node.name}"

    def resolve(module: str, expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name):
            return names[module].get(expr.id)
        if isinstance(expr, ast.Attribute) and (owner := resolve(module, expr.value)) is not None:
            return f"{owner}.{expr.attr}"
        return None

    def follow(full: str | None) -> str | None:
        """Through re-exports: ``from pkg import X`` where ``pkg`` imported ``X`` from its module."""
        while full is not None and full not in defined:
            home, _, attr = full.rpartition(".")
            nxt = names.get(home, {}).get(attr)
            if nxt is None or nxt == full:
                break
            full = nxt
        return full

    found = []
    for module, tree in modules.items():
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    target = follow(resolve(module, base))
                    if target in defined and target not in allowed:
                        found.append(f"{module}.{node.name} inherits {target}")
    return found


def test_no_engine_class_inherits_from_another():
    found = engine_subclasses(ROOT / "alchemi_core" / "dynamics", "alchemi_core.dynamics", set(ENGINE_BASES))
    assert not found, (
        f"engine classes inherit from engine classes: {found}. Compose instead (hold a collaborator, "
        "call module functions); only the public extension bases in ENGINE_BASES are subclassed"
    )


def test_the_subclass_finder_finds_subclasses(tmp_path):
    pkg = tmp_path / "eng"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from eng.base import Base\n")
    (pkg / "base.py").write_text("class Base:\n    pass\n\nclass Mixin:\n    pass\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text(
        "from typing import Protocol\nfrom eng import Base\nfrom eng.base import Mixin as M\nimport eng.base\n"
        "from ..base import Mixin\n"
        "class A(Base):\n    pass\n"  # through the package's re-export
        "class B(M, Exception):\n    pass\n"  # an alias, and an outside base
        "class C(eng.base.Mixin):\n    pass\n"  # a dotted name
        "class D(Mixin):\n    pass\n"  # a relative import
        "class E(A):\n    pass\n"  # a class of the same module
        "class F(Protocol):\n    pass\n"
    )
    assert engine_subclasses(pkg, "eng") == [
        "eng.sub.a.A inherits eng.base.Base", "eng.sub.a.B inherits eng.base.Mixin",
        "eng.sub.a.C inherits eng.base.Mixin", "eng.sub.a.D inherits eng.base.Mixin",
        "eng.sub.a.E inherits eng.sub.a.A",
    ]
    assert engine_subclasses(pkg, "eng", {"eng.base.Base", "eng.base.Mixin"}) == ["eng.sub.a.E inherits eng.sub.a.A"]
