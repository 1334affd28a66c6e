"""Modules by job, functions short: no function or method of the package longer than 80
lines (its docstring included: about 60 of code), and no package file over 600 lines (Python
and Lua). A module may pass 400 lines while it holds one job; past 600 it holds more than
one, and the seam is to be found, not the limit raised."""

from __future__ import annotations

import ast
from pathlib import Path

import aiolimit

ROOT = Path(aiolimit.__file__).resolve().parent
MOST_LINES = 600
MOST_FUNCTION_LINES = 80


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_package_file_is_over_600_lines() -> None:
    files = sorted([*ROOT.rglob("*.py"), *ROOT.rglob("*.lua")])
    sizes = {str(path.relative_to(ROOT)): _lines(path) for path in files}
    over = {name: n for name, n in sizes.items() if n > MOST_LINES}
    assert over == {}


def test_no_function_is_over_80_lines() -> None:
    over = {}
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MOST_FUNCTION_LINES:
                    over[f"{path.relative_to(ROOT)}:{node.name}"] = length
    assert over == {}
