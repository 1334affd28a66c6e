"""What importing costs and what a missing extra says: ``import aiolimit`` leaves
``redis.asyncio`` alone until ``RedisBackend`` is used, and an integration whose extra is not
installed names the extra to install."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# The install line must name this distribution: "aiolimit" on the index is another project.
DISTRIBUTION = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())[
    "project"
]["name"]


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
        ("aiolimit.aiohttp", "aiohttp", "aiohttp"),
        ("aiolimit.aiohttp_web", "aiohttp", "aiohttp"),
        ("aiolimit.otel", "opentelemetry", "otel"),
        ("aiolimit.fastapi", "starlette", "fastapi"),
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
