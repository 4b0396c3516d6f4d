"""Import circles inside a package, found from its source without importing it.

A module that imports another which (directly or through others) imports it back is a circle,
which makes the modules one knot that cannot be read or changed alone. :func:`import_circles`
reads what every module of a package imports (inside functions too; ``if TYPE_CHECKING:`` blocks
aside) and returns the groups of modules that all reach each other. ``from pkg.mod import name``
is an edge to ``pkg.mod`` (or ``pkg.mod.name`` when that is a module); parents Python imports on
the way are not counted.

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
    """Groups of more than one module that all reach each other."""
    reach = {}
    for start in graph:
        seen, todo = {start}, [start]
        while todo:
            for w in graph.get(todo.pop(), ()):
                if w not in seen:
                    seen.add(w)
                    todo.append(w)
        reach[start] = seen
    groups = {tuple(sorted(w for w in reach[v] if v in reach.get(w, ()))) for v in graph}
    return sorted(list(g) for g in groups if len(g) > 1)


def import_circles(root: Path, package: str) -> list[list[str]]:
    """The import circles of the package at ``root`` (empty when there are none)."""
    return strongly_connected(import_graph(root, package))
