"""The code blocks of README.md and docs/*.md run, so that none goes stale.

Every fenced block says its language:

- ``python`` blocks of one page run in order, in one namespace, in a fresh interpreter, as in
  ``python -m asyncio`` (top-level ``await`` works). Two addresses stand for servers the test
  provides: ``redis://localhost:6379`` is a redis-server it started (a database emptied
  before each page), ``https://partner.example`` a local HTTP server that answers 200. A
  page leaves no key without a TTL there: its limiters have a ``keep_alive`` or are deleted.
- ``sh`` blocks: ``aiolimit`` commands run, against that redis-server (``AIOLIMIT_REDIS_URL``),
  and leave no key without a TTL either;
  ``pip install`` lines must name this distribution and extras it has, ``pytest`` lines
  markers and paths that exist, ``python FILE`` and ``python -m MODULE`` lines files and
  modules that exist.
- ``console``, ``text`` and ``pycon`` blocks are shown output, not run.

A block that cannot run here (it needs a Redis Cluster, say) has ``<!-- skip: reason -->`` on
the line before it; few may.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis as sync_redis

from aiolimit import errors
from aiolimit._tools import cli
from tools import LocalRedis

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LANGUAGES = {"python", "sh", "console", "text", "pycon"}
REDIS_PLACEHOLDER = "redis://localhost:6379"
PARTNER_PLACEHOLDER = "https://partner.example"
SLOW_COMMANDS = {"demo"}  # it runs for seconds by design

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
_SKIP = re.compile(r"^\s*<!-- skip: (?P<reason>.+?) -->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the block's first line of code, counting from 1
    lang: str
    code: str
    skip: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent = opening["indent"]
        end = lines.index(f"{indent}```", i + 1)
        code = "\n".join(line.removeprefix(indent) for line in lines[i + 1 : end]) + "\n"
        before = i - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        skip = _SKIP.match(lines[before]) if before >= 0 else None
        blocks.append(Block(page, i + 2, opening["lang"], code, skip and skip["reason"]))
        i = end + 1
    return blocks


ALL_BLOCKS = [block for page in PAGES for block in blocks_of(page)]
PYTHON_PAGES = sorted({block.page for block in ALL_BLOCKS if block.lang == "python"})
SH_BLOCKS = [block for block in ALL_BLOCKS if block.lang == "sh" and block.skip is None]


def test_every_block_says_its_language_and_most_really_run():
    unlabelled = [block.where for block in ALL_BLOCKS if block.lang not in LANGUAGES]
    assert unlabelled == [], f"give these blocks one of {sorted(LANGUAGES)}"
    code = [block for block in ALL_BLOCKS if block.lang in ("python", "sh")]
    skipped = [block for block in code if block.skip is not None]
    assert len(code) >= 30
    assert len(skipped) <= len(code) // 4, [block.where for block in skipped]
    misplaced = [
        block.where for block in ALL_BLOCKS if block.skip and block.lang not in ("python", "sh")
    ]
    assert misplaced == [], "a skip marker stands before a block that never runs"


def test_the_docs_name_extras_of_this_distribution_only():
    name = PYPROJECT["project"]["name"]
    assert name != "aiolimit"  # "aiolimit" on the index is an unrelated project
    for page in PAGES:
        other = re.findall(rf"(?<![\w-])(?!{re.escape(name)}\[)[\w-]+\[\w+\]", page.read_text())
        assert [extra for extra in other if extra.startswith("aiolimit")] == [], page


def test_every_file_the_docs_name_exists():
    named = {
        (page.relative_to(ROOT), path)
        for page in PAGES
        for path in re.findall(
            r"`((?:aiolimit|tools|examples|benchmarks|tests|docs)/[\w./-]+)`", page.read_text()
        )
    }
    assert len(named) >= 20
    assert [(str(page), path) for page, path in named if not (ROOT / path).exists()] == []


def test_the_table_of_errors_names_every_error():
    page = (ROOT / "docs" / "limiters.md").read_text()
    table = page[page.index("## Errors") :]
    rows = {row.split("|")[1].split("`")[1] for row in table.splitlines() if row.startswith("| `")}
    assert rows == set(errors.__all__) - {"LimiterError"}


# -- python -------------------------------------------------------------------------------------

# Runs in the child: each block compiled with its page's line numbers (tracebacks point into
# the page), top-level await on one event loop that lives as long as the page; a deprecated
# name of aiolimit's is an error (the pages show the documented way).
RUNNER = """
import ast, asyncio, inspect, json, sys, warnings
warnings.filterwarnings("error", ".* is deprecated and goes in the next", DeprecationWarning)
namespace = {"__name__": "__main__"}
loop = asyncio.new_event_loop()
for block in json.load(sys.stdin):
    source = "\\n" * (block["line"] - 1) + block["code"]
    code = compile(source, block["page"], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if code.co_flags & inspect.CO_COROUTINE:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(eval(code, namespace))
    else:
        exec(code, namespace)
loop.run_until_complete(loop.shutdown_asyncgens())
loop.close()
"""


class _Partner(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        body = b'{"orders": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def partner_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Partner)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


DATABASE = 9  # of the session's redis-server; the other tests use database 0


@pytest.fixture
def redis_url(redis_server: LocalRedis) -> str:
    """A database of the session's redis-server, emptied before each test: the pages name
    their limiters as a reader would ("partner-api"), and several pages use the same names."""
    with sync_redis.Redis(port=redis_server.port, db=DATABASE) as client:
        client.flushdb()
    return f"{redis_server.url}/{DATABASE}"


def _substituted(code: str, redis_url: str, partner_url: str) -> str:
    return code.replace(REDIS_PLACEHOLDER, redis_url).replace(PARTNER_PLACEHOLDER, partner_url)


@pytest.mark.slow
@pytest.mark.parametrize("page", PYTHON_PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_the_python_blocks_of_a_page_run(page: Path, redis_url: str, partner_url: str):
    blocks = [b for b in blocks_of(page) if b.lang == "python" and b.skip is None]
    payload = [
        {"page": str(b.page), "line": b.line, "code": _substituted(b.code, redis_url, partner_url)}
        for b in blocks
    ]
    result = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
        cwd=ROOT,
        env={**os.environ, "AIOLIMIT_REDIS_URL": ""},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert keys_kept_for_good(redis_url) == [], "delete the limiters, or give them keep_alive"


def keys_kept_for_good(redis_url: str) -> list[str]:
    """The keys without a TTL that a page left in the reader's Redis: a limiter's config stays
    for good unless the limiter has a ``keep_alive`` (or is deleted)."""
    with sync_redis.Redis.from_url(redis_url) as client:
        return sorted(key.decode() for key in client.scan_iter() if client.pttl(key) == -1)


# -- sh -----------------------------------------------------------------------------------------


def commands_of(block: Block) -> list[list[str]]:
    """The block's commands as argument lists: comments dropped, continued lines joined,
    ``a && b`` split in two."""
    commands = []
    for line in block.code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            end = words.index("&&") if "&&" in words else len(words)
            commands.append(words[:end])
            words = words[end + 1 :]
    return commands


def _is_slow(block: Block) -> bool:
    return any(
        command[:1] == ["aiolimit"] and command[1:2] and command[1] in SLOW_COMMANDS
        for command in commands_of(block)
    )


def _check_pip_install(command: list[str]) -> None:
    name = PYPROJECT["project"]["name"]
    extras_known = set(PYPROJECT["project"]["optional-dependencies"])
    targets = [word for word in command[2:] if not word.startswith("-")]
    assert targets, command
    for target in targets:
        project, _, extras = target.partition("[")
        assert project in (".", name), f"{command}: this project is {name!r} on the index"
        extras_named = set(filter(None, extras.rstrip("]").split(",")))
        assert extras_named <= extras_known, f"{command}: no extra {extras_named - extras_known}"


def _check_pytest(command: list[str]) -> None:
    markers = {line.split(":")[0] for line in PYPROJECT["tool"]["pytest"]["ini_options"]["markers"]}
    words = iter(command[1:])
    for word in words:
        if word == "-m":
            named = set(re.findall(r"\w+", next(words))) - {"and", "or", "not"}
            assert named <= markers, f"{command}: no marker {named - markers}"
        elif not word.startswith("-"):
            assert (ROOT / word.split("::")[0]).exists(), f"{command}: no {word}"


def _run_aiolimit(command: list[str], redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Runs the command in this process (``aiolimit`` is ``cli.main``), which saves starting
    an interpreter per command."""
    args = command[3:] if command[:3] == ["python", "-m", "aiolimit"] else command[1:]
    try:
        code = cli.main([arg.replace(REDIS_PLACEHOLDER, redis_url) for arg in args])
    except SystemExit as exit:
        code = exit.code
    out, err = capsys.readouterr()
    assert code == 0, f"{command} exited {code}\n{out}{err}"


@pytest.mark.parametrize(
    "block",
    [pytest.param(b, marks=[pytest.mark.slow] if _is_slow(b) else []) for b in SH_BLOCKS],
    ids=lambda block: block.where,
)
def test_the_commands_of_a_sh_block_run_or_name_what_exists(
    block: Block,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
):
    monkeypatch.setenv("AIOLIMIT_REDIS_URL", redis_url)
    for command in commands_of(block):
        if command[:2] == ["pip", "install"]:
            _check_pip_install(command)
        elif command[:1] == ["pytest"]:
            _check_pytest(command)
        elif command[:1] == ["aiolimit"] or command[:3] == ["python", "-m", "aiolimit"]:
            _run_aiolimit(command, redis_url, capsys)
        elif command[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(command[2]), f"{block.where}: no module {command[2]}"
        elif command[:1] == ["python"] and command[1:2] and command[1].endswith(".py"):
            assert (ROOT / command[1]).is_file(), f"{block.where}: no {command[1]}"
        elif command[:2] == ["mkdocs", "build"]:
            assert (ROOT / "mkdocs.yml").is_file()
        else:
            raise AssertionError(f"{block.where}: the test cannot check {command}")
    assert keys_kept_for_good(redis_url) == [], f"{block.where}: delete the limiters it made"
