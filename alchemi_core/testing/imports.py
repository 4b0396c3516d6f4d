"""Import circles inside a package, found from its source without importing it.

A module that imports another which (directly or through others) imports it back is a circle:
it only works while every import in it happens inside a function, and it makes the modules one
knot that cannot be read or changed alone. :func:`import_circles` reads every module of a
package, collects what it imports (at the top and inside functions; imports under
``if TYPE_CHECKING:`` aside, as they never run) and returns the strongly connected groups of
modules. An import names the module it loads: ``from pkg.mod import name`` is an edge to
``pkg.mod`` (or to ``pkg.mod.name`` when that is a module); importing a package is an edge to
its ``__init__``. Parents that Python imports on the way are not counted, so a submodule may be
imported by its package's ``__init__``.

Example:
    >>> from pathlib import Path
    >>> import alchemi_core
    >>> import_circles(Path(alchemi_core.__file__).parent, "alchemi_core")
    []
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package at ``root`` (a directory with ``__init__.py``), by name."""
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = [package, *rel.parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool, modules: set[str] | dict[str, Path]) -> set[str]:
    """The modules ``tree`` loads (absolute names), type-checking blocks aside."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for branch in node.orelse:
                visit(branch)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:
                sub = f"{prefix}.{alias.name}"
                found.add(sub if sub in modules else prefix)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """For each module of the package, the modules of the same package it imports."""
    files = module_files(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        imported = _imports(tree, name, path.name == "__init__.py", files)
        graph[name] = {t for t in imported if t in files and t != name}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of more than one module that all reach each other (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0

    def connect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(groups)


def import_circles(root: Path, package: str) -> list[list[str]]:
    """The import circles of the package at ``root`` (empty when there are none)."""
    return strongly_connected(import_graph(root, package))
