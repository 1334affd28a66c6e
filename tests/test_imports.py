"""What importing costs and what a missing extra says: ``import aiolimit`` leaves
``redis.asyncio`` alone until ``RedisBackend`` is used, and an integration whose extra is not
installed names the extra to install. What imports what: the package holds none of the lab
(``tools/``) and imports nothing from it; the benchmarks take their harness from the lab,
never from the tests."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from import_graph import find_cycle, import_graph

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# The install line must name this distribution: "aiolimit" on the index is another project.
DISTRIBUTION = PYPROJECT["project"]["name"]


def run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


def test_import_aiolimit_does_not_import_redis() -> None:
    code = (
        "import sys, aiolimit, aiolimit.asgi\n"
        "backend = aiolimit.MemoryBackend()\n"
        "print(sorted(m for m in sys.modules if m == 'redis' or m.startswith('redis.')))"
    )
    assert run(code) == "[]"


def test_redis_backend_is_imported_when_first_named() -> None:
    code = (
        "import sys\n"
        "from aiolimit import RedisBackend\n"
        "import aiolimit.backends as b\n"
        "print(RedisBackend.__module__, b.RedisBackend is RedisBackend, 'redis' in sys.modules)"
    )
    assert run(code) == "aiolimit.backends.redis True True"


@pytest.mark.parametrize(
    ("module", "dependency", "extra"),
    [
        ("aiolimit.httpx", "httpx", "httpx"),
        ("aiolimit.httpx2", "httpx2", "httpx2"),
        ("aiolimit.aiohttp", "aiohttp", "aiohttp"),
        ("aiolimit.aiohttp_web", "aiohttp", "aiohttp"),
        ("aiolimit.otel", "opentelemetry", "otel"),
        ("aiolimit.fastapi", "starlette", "fastapi"),
        ("aiolimit.langchain", "langchain_core", "langchain"),
    ],
)
def test_a_missing_extra_names_what_to_install(
    monkeypatch: pytest.MonkeyPatch, module: str, dependency: str, extra: str
) -> None:
    for name in list(sys.modules):
        if name in (module, dependency) or name.startswith(dependency + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, dependency, None)  # as if it were not installed
    with pytest.raises(ImportError) as raised:
        importlib.import_module(module)
    assert f"pip install '{DISTRIBUTION}[{extra}]'" in str(raised.value)
    assert module in str(raised.value)


def test_the_httpx2_transport_needs_no_httpx() -> None:
    # The LLM SDKs install httpx2 and not httpx: the transport must import without it.
    code = (
        "import sys\n"
        "sys.modules['httpx'] = None  # as if it were not installed\n"
        "import httpx2\n"
        "from aiolimit.httpx2 import RateLimitedTransport\n"
        "print(issubclass(RateLimitedTransport, httpx2.AsyncBaseTransport))"
    )
    assert run(code) == "True"


def _imported(path: Path) -> set[str]:
    """The top-level modules a file imports (relative imports left out), and any directory
    it puts on ``sys.path`` by name, as ``path:NAME``."""
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Constant) and node.value in ("tests", "tools"):
            names.add(f"path:{node.value}")
    return names


def test_the_wheel_holds_the_package_and_none_of_the_lab() -> None:
    assert PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["aiolimit"]
    modules = [path.relative_to(ROOT) for path in (ROOT / "aiolimit").rglob("*.py")]
    lab = [str(path) for path in modules if {"soak", "server", "audit"} & {path.stem, *path.parts}]
    assert lab == [], "the soak, the server manager and the audits belong in tools/"
    importing = [str(path) for path in modules if _imported(ROOT / path) & {"tools", "tests"}]
    assert importing == []


def test_the_metadata_names_the_project_s_pages_on_the_index() -> None:
    urls = PYPROJECT["project"]["urls"]
    assert {"Homepage", "Changelog"} <= set(urls)
    # Only addresses that exist for this distribution: its page on the index (and its history)
    index_page = f"https://pypi.org/project/{DISTRIBUTION}/"
    assert urls["Homepage"] == index_page
    assert urls["Changelog"] == index_page + "#history"
    assert all(url.startswith(index_page) for url in urls.values()), urls


def test_the_benchmarks_take_their_harness_from_the_lab_not_the_tests() -> None:
    helpers = {path.stem for path in (ROOT / "tests").glob("*.py")}
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        wrong = _imported(path) & (helpers | {"tests", "path:tests"})
        assert wrong == set(), f"{path.name} imports {sorted(wrong)} from tests/"


def test_tests_take_shared_helpers_from_helper_modules_not_from_test_modules() -> None:
    importing = {
        path.name: sorted(n for n in _imported(path) if n.startswith("test_"))
        for path in sorted((ROOT / "tests").glob("*.py"))
    }
    assert {name: found for name, found in importing.items() if found} == {}


# -- the import graph ------------------------------------------------------------------------------

ENGINE = "aiolimit._acquire"
ABOVE_THE_ENGINE = ("aiolimit._base", "aiolimit._limiter", "aiolimit._sharded", "aiolimit._calls")


def test_no_module_of_aiolimit_imports_itself_back_through_others() -> None:
    graph = import_graph()
    assert ENGINE in graph and "aiolimit.asgi._gate" in graph  # (the graph is read)
    assert find_cycle(graph) is None


def test_the_engine_is_a_leaf_below_every_limiter_and_surface() -> None:
    graph = import_graph()
    below: set[str] = set()
    stack = [ENGINE]
    while stack:
        for module in graph[stack.pop()] - below:
            below.add(module)
            stack.append(module)
    above = [
        module
        for module in below
        if module in ABOVE_THE_ENGINE
        or module.startswith(("aiolimit.asgi", "aiolimit._tools"))
        or module
        in (
            "aiolimit.httpx",
            "aiolimit.httpx2",
            "aiolimit.aiohttp",
            "aiolimit.fastapi",
            "aiolimit.otel",
            "aiolimit.langchain",
        )
    ]
    assert above == [], f"the engine imports {sorted(above)}"
