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
    "alchemi_core.data.buffer_ops:_chosen": "the buffer:* plugin found for each device type, looked up once "
                                            "(set_buffer_ops overrides it: a switch in effect, to be made an argument)",
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
    "alchemi_core.warp_runtime:global _pool": "the CPU launches' thread pool, made at first use",
    "alchemi_core.warp_runtime:global _pool_size": "that pool's size (it is made anew for a new thread count)",
    "alchemi_warp.buffer_ops:_zero_words": "cache: a zero word per device and dtype",
    "alchemi_zarr.chunks:_WARNED": "the warnings given once per process",
    "alchemi_zarr.local_files:global _executor": "the file writers' thread pool, made at first use",
    "alchemi_zarr.local_files:global _executor_key": "the process and size that pool was made for",
    "alchemi_zarr.stores:_process_locks": "registry: one lock per store path in this process",
}

#: Switches of the modules the ``cpupaths`` branch deletes (cpu_executor*, warp_recordings,
#: langevin_lanes, langevin_blocks), with what patches them: deleted by the cpupaths branch. The
#: lead removes this list when merging it.
DELETED_BY_CPUPATHS: dict[str, str] = {
    "alchemi_core.cpu_executor:global _executor": "the native worker threads",
    "alchemi_core.cpu_executor:SPIN_SECONDS": "tests/test_cpu_executor.py",
    "alchemi_core.cpu_executor:ENABLED": "tests/test_cpu_executor.py",
    "alchemi_core.warp_recordings:REUSE": "tests/test_warp_recordings.py",
    "alchemi_core.warp_recordings:_recordings": "cache of recorded launches",
    "alchemi_core.warp_recordings:MAX_KEPT": "tests/test_warp_recordings.py",
    "alchemi_integrators.langevin_lanes:BY_DEVICE": "the integrators' Langevin tests",
    "alchemi_integrators.langevin_lanes:CHUNKED_FROM": "test_langevin_lanes.py",
    "alchemi_integrators.langevin_blocks:BY_DEVICE": "the integrators' Langevin tests",
    # The CPU range machinery of warp_runtime, which the cpupaths branch deletes with them.
    "alchemi_core.warp_runtime:MIN_CHUNKED_DIM": "tests of kernels cut in ranges",
    "alchemi_potentials.neighbors.cell_list:CHECK_IN_RANGES_FROM": "test_neighbor_list.py (ranges' handoff)",
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
    skip = {".venv", ".git", "node_modules", "build", "dist"}
    return [p for p in sorted(ROOT.rglob("*.py")) if not skip & set(p.relative_to(ROOT).parts)]


def test_product_code_has_no_module_level_mutable_state():
    found = []
    for path in _product_files():
        found += mutable_globals(path.read_text(encoding="utf-8"), _module_name(path))
    allowed = set(ALLOWED_MUTABLE_GLOBALS) | set(DELETED_BY_CPUPATHS)
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
    allowed = set(ALLOWED_PATCHED_CONSTANTS) | set(DELETED_BY_CPUPATHS)
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
