"""Running the ``aiolimit`` commands against a real redis-server: in this process
(``aiolimit``: stdout and stderr captured) or as a subprocess (``run_command``: where exit codes,
stderr and tracebacks matter), with state made through the library first (``on_server``).

>>> on_server(url, lambda backend: full_with_a_reservation(backend, name))
>>> code, out, err = aiolimit(capsys, url, "inspect", name)
>>> field(out, "available")             # "0 of 10 permits now"
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from redis.asyncio import Redis

from aiolimit import RateLimiter, RateLimiterConfig, RateType, RedisBackend
from aiolimit._tools import cli
from aiolimit._tools.admin.glob import limiter_names
from aiolimit.backends.base import Grant

__all__ = [
    "aiolimit",
    "field",
    "full_with_a_reservation",
    "limiters_on",
    "on_server",
    "run_command",
]

T = TypeVar("T")


def on_server(
    url: str, work: Callable[[RedisBackend], Awaitable[T]], prefix: str = "aiolimit:"
) -> T:
    """Runs ``work`` on a backend of the server at ``url``, in an event loop of its own."""

    async def run() -> T:
        redis = Redis.from_url(url)
        try:
            return await work(RedisBackend(redis, prefix=prefix))
        finally:
            await redis.aclose()

    return asyncio.run(run())


def limiters_on(url: str, prefix: str) -> list[str]:
    """The names of every limiter config on the server under ``prefix`` (a shard's too)."""

    async def read(backend: RedisBackend) -> list[str]:
        return sorted({each async for each in limiter_names(backend)})

    return on_server(url, read, prefix)


def aiolimit(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, str, str]:
    """``aiolimit ARGS --redis URL`` in this process: its exit code, stdout and stderr."""
    code = cli.main([*args, "--redis", url])
    out, err = capsys.readouterr()
    return code, out, err


def field(out: str, label: str) -> str:
    """The value of the one line of ``out`` that starts with ``label``."""
    (line,) = [line for line in out.splitlines() if line.startswith(f"{label} ")]
    return line[len(label) :].strip()


def run_command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m aiolimit ARGS`` as a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "aiolimit", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


async def full_with_a_reservation(backend: RedisBackend, name: str) -> Grant:
    """A limiter of 10 per minute with every permit taken, 3 more reserved (starting in about
    60 s, made without sleeping) and a TTL of 300 s: the reservation it made."""
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 10, 60))
    assert await limiter.try_acquire(10)
    reserved = await backend.try_acquire(name, 3, None)  # starts in about 60 s; no sleep
    assert isinstance(reserved, Grant) and reserved.starts_in > 59_000_000
    assert await limiter.expire(300)
    return reserved
