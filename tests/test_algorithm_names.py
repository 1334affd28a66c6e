"""Adding an algorithm is one Lua file, one Python module and its conformance cases: the rest
of the code asks the algorithm (its table in ``ALGORITHMS``, its ``Group``), never names it.
A name outside its own files (``if algorithm == 'TOKEN_BUCKET'``,
``isinstance(group, TokenBucket)``) is one more place each new algorithm must be taught.

The scan reads the code of ``aiolimit/`` and ``tools/`` (not comments or docstrings, which may
point to an algorithm's files) for each algorithm's names: ``SLIDING_WINDOW`` in any case,
and its memory twin's class. Besides the algorithm's own files, a name may stand only on the
lines listed in ``ALLOWED``: the tables that list every algorithm, and the default."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_LUA, _MEMORY = "aiolimit/backends/redis/lua", "aiolimit/backends/memory"
OWN = {
    "SLIDING_WINDOW": {f"{_LUA}/sliding_window.lua", f"{_MEMORY}/_sliding.py"},
    "TOKEN_BUCKET": {f"{_LUA}/token_bucket.lua", f"{_MEMORY}/_token_bucket.py"},
    "FIXED_WINDOW": {f"{_LUA}/fixed_window.lua", f"{_MEMORY}/_fixed_window.py"},
}
"""Each algorithm's own files: its Lua file and its memory twin's module."""

CLASSES = {
    "SlidingLog": "SLIDING_WINDOW",
    "TokenBucket": "TOKEN_BUCKET",
    "FixedWindow": "FIXED_WINDOW",
}
NAME = re.compile(r"\b(?:sliding_window|token_bucket|fixed_window)\b", re.IGNORECASE)
CLASS = re.compile(r"\b(?:SlidingLog|TokenBucket|FixedWindow)\b")

_DEFAULT_PARAMETER = "algorithm: Algorithm | str = Algorithm.SLIDING_WINDOW,"
ALLOWED: dict[str, set[str]] = {
    # the enum
    "aiolimit/_rates.py": {
        'SLIDING_WINDOW = "SLIDING_WINDOW"',
        'TOKEN_BUCKET = "TOKEN_BUCKET"',
        'FIXED_WINDOW = "FIXED_WINDOW"',
    },
    # the default, in a config's parameters and its text (written only where not the default)
    "aiolimit/_types.py": {
        "algorithm: Algorithm = Algorithm.SLIDING_WINDOW,",
        _DEFAULT_PARAMETER,
        "if self.algorithm is not Algorithm.SLIDING_WINDOW:",
    },
    # the tables: the Lua files every script starts with, the memory twin's groups, the soak's
    # bounds and checks
    "aiolimit/backends/redis/_script.py": {
        '"sliding_window",',
        '"token_bucket",',
        '"fixed_window",',
    },
    "aiolimit/backends/memory/_budgets.py": {
        "from ._fixed_window import FixedWindow",
        "from ._sliding import SlidingLog",
        "from ._token_bucket import TokenBucket",
        "Algorithm.SLIDING_WINDOW: SlidingLog,",
        "Algorithm.TOKEN_BUCKET: TokenBucket,",
        "Algorithm.FIXED_WINDOW: FixedWindow,",
    },
    "tools/soak/algorithms.py": {
        "Algorithm.SLIDING_WINDOW: Bounds(",
        "Algorithm.FIXED_WINDOW: Bounds(",
        "Algorithm.TOKEN_BUCKET: Bounds(",
    },
    # the default: a limiter (or a stored config) that names no algorithm
    "aiolimit/backends/redis/lua/lib.lua": {"local DEFAULT_ALGORITHM = 'SLIDING_WINDOW'"},
    "aiolimit/backends/redis/_scripts.py": {
        'Algorithm(fields.get("algorithm", Algorithm.SLIDING_WINDOW.value)),'
    },
    "aiolimit/asgi/_rules.py": {
        "self.algorithm = Algorithm.SLIDING_WINDOW if algorithm is None else Algorithm(algorithm)"
    },
    "aiolimit/_tools/admin/change.py": {"_DEFAULT_ALGORITHM = Algorithm.SLIDING_WINDOW.value"},
    "tools/soak/limits.py": {"DEFAULT_ALGORITHM = Algorithm.SLIDING_WINDOW"},
    "tools/soak/worker.py": {'algorithm: str = "SLIDING_WINDOW"'},
}


def _python_code(text: str) -> list[tuple[int, str]]:
    """The names and strings of a module with their lines, leaving out comments and docstrings
    (a string that is a statement by itself)."""
    found: list[tuple[int, str]] = []
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    starts = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT}
    for i, token in enumerate(tokens):
        if token.type == tokenize.NAME:
            found.append((token.start[0], token.string))
        elif token.type == tokenize.STRING:
            alone = (i == 0 or tokens[i - 1].type in starts) and tokens[i + 1].type in (
                tokenize.NEWLINE,
                tokenize.ENDMARKER,
            )
            if not alone:
                found.append((token.start[0], token.string))
    return found


def _lua_code(text: str) -> list[tuple[int, str]]:
    """Each line of a Lua file without its comment (a ``--`` outside a string)."""
    found: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        quote, code = None, []
        for i, char in enumerate(line):
            if quote is None and line.startswith("--", i):
                break
            if quote is None and char in "'\"":
                quote = char
            elif char == quote and line[i - 1] != "\\":
                quote = None
            code.append(char)
        found.append((number, "".join(code)))
    return found


def _names(path: Path) -> list[tuple[int, str]]:
    """(line, algorithm) for each algorithm a file's code names."""
    text = path.read_text()
    code = _lua_code(text) if path.suffix == ".lua" else _python_code(text)
    named = []
    for number, part in code:
        for match in NAME.finditer(part):
            named.append((number, match[0].upper()))
        for match in CLASS.finditer(part):
            named.append((number, CLASSES[match[0]]))
    return named


def _files() -> list[Path]:
    return sorted(
        path
        for folder in ("aiolimit", "tools")
        for pattern in ("*.py", "*.lua")
        for path in (ROOT / folder).rglob(pattern)
    )


def test_no_code_names_an_algorithm_outside_its_own_files_and_the_tables() -> None:
    stray = []
    for path in _files():
        relative = path.relative_to(ROOT).as_posix()
        lines = path.read_text().splitlines()
        for number, algorithm in _names(path):
            line = lines[number - 1].strip()
            if relative not in OWN[algorithm] and line not in ALLOWED.get(relative, set()):
                stray.append(f"{relative}:{number}: {line}")
    assert not stray, "an algorithm named outside its files and the tables:\n" + "\n".join(
        dict.fromkeys(stray)
    )


def test_every_allowed_line_is_still_there() -> None:
    """An entry of ``ALLOWED`` that matches no line is stale: the list stays precise."""
    for relative, allowed in ALLOWED.items():
        path = ROOT / relative
        lines = {path.read_text().splitlines()[n - 1].strip() for n, _ in _names(path)}
        assert allowed <= lines, f"{relative}: {sorted(allowed - lines)}"


def test_the_scan_sees_a_branch_and_not_a_comment() -> None:
    lua = "if algorithm == 'TOKEN_BUCKET' then -- not 'FIXED_WINDOW'\nend\n-- SLIDING_WINDOW"
    assert [(n, a) for n, part in _lua_code(lua) for a in NAME.findall(part)] == [
        (1, "TOKEN_BUCKET")
    ]
    python = '"""SLIDING_WINDOW"""\nx = isinstance(g, TokenBucket)  # FIXED_WINDOW\n'
    assert [(n, s) for n, s in _python_code(python) if CLASS.search(s) or NAME.search(s)] == [
        (2, "TokenBucket")
    ]
