"""Every module's ``__all__`` is true: each name it lists exists, each name another aiolimit
module imports from it is listed (a module without ``__all__`` is private by name), every
public module has one, and every public name of ``aiolimit`` is in the API reference."""

from __future__ import annotations

import ast
import importlib

import pytest
from import_graph import ROOT, package_modules, resolve_from

import aiolimit

MODULES = package_modules()
DOCS = ROOT.parent / "docs"
# The one private helper still imported across modules: the sharded limiter's choice of error
# lives in _base.py until that module is split (it is over the size limit too: test_sizes.py).
UNLISTED: set[str] = set()


def _listed(module: str) -> list[str] | None:
    return getattr(importlib.import_module(module), "__all__", None)


def _private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


def _imports_by_name() -> list[tuple[str, str, str]]:
    """Every ``from <aiolimit module> import name`` in the package: (importer, module, name)."""
    found = []
    for importer, (path, package) in sorted(MODULES.items()):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                module = resolve_from(importer, package, node)
                for alias in node.names:
                    if module in MODULES and f"{module}.{alias.name}" not in MODULES:
                        found.append((importer, module, alias.name))
    return found


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_name_a_module_lists_exists(module: str) -> None:
    imported = importlib.import_module(module)
    missing = [name for name in _listed(module) or () if not hasattr(imported, name)]
    assert missing == []


def test_every_public_module_lists_its_names() -> None:
    assert [m for m in sorted(MODULES) if not _private(m) and _listed(m) is None] == []


def test_a_name_imported_across_modules_is_in_its_modules_all() -> None:
    unlisted = []
    for importer, module, name in _imports_by_name():
        listed = _listed(module)
        if (listed is None and not _private(module)) or (listed is not None and name not in listed):
            unlisted.append(f"{importer}: from {module} import {name}")
    assert set(unlisted) == UNLISTED


def test_every_public_name_is_in_the_api_reference() -> None:
    reference = (DOCS / "api.md").read_text(encoding="utf-8")
    assert "::: aiolimit.errors\n" in reference  # (the errors, all of them, on one page)
    on_their_own = [n for n in aiolimit.__all__ if n not in aiolimit.errors.__all__]
    missing = [n for n in on_their_own if f"::: aiolimit.{n}\n" not in reference]
    assert missing == ["__version__"]


@pytest.mark.parametrize("name", ["Grant", "Refusal"])
def test_what_acquired_attempts_holds_is_public(name: str) -> None:
    assert name in aiolimit.__all__
    assert getattr(aiolimit, name) is getattr(aiolimit.backends, name)
