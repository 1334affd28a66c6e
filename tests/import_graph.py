"""The import graph of aiolimit's modules, read from their source: every ``import`` and
``from ... import`` anywhere in a module (inside functions too: a lazy import is still an
import), resolved to the aiolimit modules it names.

>>> graph = import_graph()
>>> graph["aiolimit._limiter"]          # {"aiolimit._acquire", "aiolimit._base", ...}
>>> find_cycle(graph)                   # None, or the modules of one cycle, in order

A submodule's import of its parent package (which Python makes first) is not an edge: the
packages' ``__init__`` modules are facades that import the modules below them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import aiolimit

__all__ = ["ROOT", "find_cycle", "import_graph", "package_modules", "resolve_from"]

ROOT = Path(aiolimit.__file__).resolve().parent


def package_modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package: its dotted name, its file, whether it is a package."""
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if package else parts)] = (path, package)
    return modules


def resolve_from(name: str, package: bool, node: ast.ImportFrom) -> str:
    """The dotted module a ``from ... import`` statement of module ``name`` imports from."""
    if node.level:
        parts = name.split(".") if package else name.split(".")[:-1]
        parts = parts[: len(parts) - node.level + 1]
    else:
        parts = []
    return ".".join(parts + ([node.module] if node.module else []))


def _targets(name: str, package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import statement of module ``name`` reaches for."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = resolve_from(name, package, node)
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def import_graph() -> dict[str, set[str]]:
    """Each aiolimit module, with the aiolimit modules it imports."""
    modules = package_modules()
    graph: dict[str, set[str]] = {}
    for name, (path, package) in modules.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imported.update(t for t in _targets(name, package, node) if t in modules)
        # (``from . import _observe`` reaches for the package too: a parent, not an edge.)
        graph[name] = imported - {name} - _parents(name)
    return graph


def _parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """The modules of one import cycle, in order (the first again at the end), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        path.append(module)
        for imported in sorted(graph[module]):
            cycle = visit(imported)
            if cycle is not None:
                return cycle
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module)
        if cycle is not None:
            return cycle
    return None
