"""No package file over 400 lines (Python and Lua): past that, a module holds more than one
job, and the seam is to be found, not the limit raised."""

from __future__ import annotations

from pathlib import Path

import aiolimit

ROOT = Path(aiolimit.__file__).resolve().parent
MOST_LINES = 400


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_package_file_is_over_400_lines() -> None:
    files = sorted([*ROOT.rglob("*.py"), *ROOT.rglob("*.lua")])
    sizes = {str(path.relative_to(ROOT)): _lines(path) for path in files}
    over = {name: n for name, n in sizes.items() if n > MOST_LINES}
    assert over == {}
