"""Backends for the conformance suite: memory, fakeredis, and real redis-server and Valkey.

The real servers are started on free loopback ports for the session and stopped after it.
A missing server binary is an error, never a skip.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from conformance import LoopLag, Sleepers
from flavours import FLAVOURS, Flavour
from redis.asyncio import Redis
from servers import valkey_server_binary

import aiolimit
from aiolimit import Backend, MemoryBackend, RedisBackend
from aiolimit.backends import _margin
from tools import LocalRedis

_names = itertools.count()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After each test module, collects its garbage and freezes what lives on (the session's
    fixtures, imported modules, pytest's reports), so that the collector's full passes in
    later tests walk only what those tests made: a full pass over the whole session's heap
    stalls the event loop for 0.1-0.9 s on a loaded 2-core machine, and real-time tests
    would read that stall as a late grant."""
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        gc.collect()
        gc.freeze()


@pytest.fixture(autouse=True)
def exact_rates(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's schedules are the exact rates': no margin begins, and no lateness is
    reported (the fleet's measured margin, backends/_margin.py), except in the tests marked
    ``measured_margin``, which test it."""
    if request.node.get_closest_marker("measured_margin") is None:
        monkeypatch.setattr(_margin, "LAW", _margin.LAW._replace(start=0, floor=0))
        monkeypatch.setattr(_margin.Margins, "late", lambda *args: None)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedis]:
    with LocalRedis() as server:
        yield server


@pytest.fixture
def asleep() -> Iterator[Sleepers]:
    """Counts this process's callers sleeping out a reservation, for the test's duration."""
    sleepers = Sleepers()
    previous = aiolimit.observe(sleepers)
    try:
        yield sleepers
    finally:
        aiolimit.observe(previous)


@pytest.fixture
def url(redis_server: LocalRedis) -> str:
    """The session's redis-server, as the commands' ``--redis`` takes it."""
    return redis_server.url


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[LocalRedis]:
    with LocalRedis(binary=valkey_server_binary()) as server:
        yield server


@dataclass
class Store:
    """One shared store (a server, a fakeredis instance or one memory dict) for a test."""

    kind: str
    make: Callable[..., Backend]
    server: LocalRedis | None = None
    clients: list[Redis] = field(default_factory=list)

    def backend(self, client_id: str | None = None, **options: Any) -> Backend:
        """A backend on the shared store; each call is another client of it."""
        return self.make(client_id=client_id, **options)

    @property
    def is_redis(self) -> bool:
        return self.kind != "memory"

    @property
    def real_server(self) -> bool:
        return self.kind in ("redis", "valkey")


def _memory_store() -> Store:
    shared = MemoryBackend()

    def make(client_id: str | None = None, **options: Any) -> Backend:
        base = MemoryBackend(**options) if options else shared
        if options:
            base._shared = shared._shared  # same store, another clock
        return base.with_client(client_id) if client_id else base

    return Store("memory", make)


def _redis_store(kind: str, connect: Callable[[], Redis], server: LocalRedis | None) -> Store:
    clients: list[Redis] = []
    shared: list[Redis] = []

    def make(client_id: str | None = None, own_connection: bool = False, **options: Any) -> Backend:
        if own_connection or not shared:
            clients.append(connect())
            if not shared:
                shared.append(clients[-1])
        redis = clients[-1] if own_connection else shared[0]
        return RedisBackend(redis, client_id=client_id, **options)

    return Store(kind, make, server=server, clients=clients)


BACKENDS = [
    pytest.param("memory", marks=pytest.mark.looptime),
    "fakeredis",
    "redis",
    "valkey",
]


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    kind: str = request.param
    if kind == "memory":
        yield _memory_store()
        return
    if kind == "fakeredis":
        import fakeredis

        fake = fakeredis.FakeServer()
        result = _redis_store(kind, lambda: fakeredis.FakeAsyncRedis(server=fake), None)
    else:
        real: LocalRedis = request.getfixturevalue(f"{kind}_server")
        result = _redis_store(kind, lambda: Redis.from_url(real.url), real)
    first = result.backend()
    assert isinstance(first, RedisBackend)
    await first.redis.flushall()
    LoopLag.current = lag = LoopLag().start()  # real time: how late the loop itself runs
    try:
        yield result
    finally:
        LoopLag.current = None
        await lag.stop()
        for client in result.clients:
            await client.aclose()


@pytest.fixture
async def loop_lag() -> AsyncIterator[LoopLag]:
    """How late the test's event loop runs, for a ``Tolerance`` in a test without ``store``."""
    lag = LoopLag().start()
    try:
        yield lag
    finally:
        await lag.stop()


@pytest.fixture(params=FLAVOURS)
def flavour(request: pytest.FixtureRequest) -> Flavour:
    """httpx, then httpx2: the transport's tests that run under both."""
    return Flavour.of(request.param)


@pytest.fixture
def name() -> str:
    """A fresh limiter name per test."""
    return f"limiter-{next(_names)}"


async def settle() -> None:
    """Lets callbacks scheduled by the code under test run."""
    for _ in range(3):
        await asyncio.sleep(0)
