"""The ASGI middleware's ``concurrency=``: at most the limit of HTTP requests served at once,
through a real server (uvicorn) on memory and on a real redis-server; a request over the cap
waits for a slot up to ``wait``, else 503 with Retry-After and no permit spent; the slot comes
back when the app is done, or when the request is cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from conformance import cancelled, until
from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from aiolimit import (
    ConcurrencyLimiter,
    InvalidArgumentError,
    MemoryBackend,
    RateLimiter,
    RedisBackend,
)
from aiolimit.asgi import RateLimitMiddleware, Rule
from tools import LocalRedis, free_port

CAP = 2


class App:
    """Counts the requests it serves at once; each is held ``hold`` s, or until ``release``."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0
        self.hold: float | None = 0.05
        self.release = asyncio.Event()

    async def handle(self, request: Request) -> PlainTextResponse:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            if self.hold is None:
                await self.release.wait()
            else:
                await asyncio.sleep(self.hold)
        finally:
            self.in_flight -= 1
        return PlainTextResponse("ok")

    def starlette(self) -> Starlette:
        return Starlette(routes=[Route("/{tail:path}", self.handle)])


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield MemoryBackend()
        return
    real: LocalRedis = request.getfixturevalue("redis_server")
    redis = Redis.from_url(real.url)
    await redis.flushall()
    yield RedisBackend(redis)
    await redis.aclose()


async def capped(backend: Any, app: App, **options: Any) -> RateLimitMiddleware:
    sem = ConcurrencyLimiter("served-at-once", backend)
    await sem.set_limit(CAP, lease=30)
    return RateLimitMiddleware(
        app.starlette(),
        backend=backend,
        rules=[Rule("served", "5/minute")],
        concurrency=sem,
        **options,
    )


async def in_flight(backend: Any) -> int:
    snapshot = await ConcurrencyLimiter("served-at-once", backend).leases()
    assert snapshot is not None
    return snapshot.in_flight


async def serving(middleware: RateLimitMiddleware) -> tuple[Any, asyncio.Future[Any], str]:
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(middleware, host="127.0.0.1", port=port, log_level="warning")
    )
    task = asyncio.ensure_future(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn has no event for it
        await asyncio.sleep(0.01)
    return server, task, f"http://127.0.0.1:{port}"


async def test_uvicorn_serves_at_most_the_cap_at_once_and_queues_the_rest(backend: Any):
    app = App()
    middleware = await capped(backend, app, wait=5)
    server, task, url = await serving(middleware)
    try:
        async with httpx.AsyncClient(base_url=url) as http:
            answers = await asyncio.gather(*(http.get("/api") for _ in range(6)))
    finally:
        server.should_exit = True
        await task
    assert sorted(a.status_code for a in answers) == [200] * 5 + [429]  # the rate, kept
    assert app.most == CAP
    assert middleware.stats.busy == 0
    assert await in_flight(backend) == 0


async def test_uvicorn_over_the_cap_without_a_wait_is_503_and_spends_no_permit(backend: Any):
    app = App()
    app.hold = None
    middleware = await capped(backend, app)
    server, task, url = await serving(middleware)
    try:
        async with httpx.AsyncClient(base_url=url) as http:
            held = [asyncio.ensure_future(http.get("/api")) for _ in range(CAP)]
            await until(lambda: in_flight(backend), lambda n: n == CAP, "the slots taken")
            refused = await http.get("/api")
            app.release.set()
            served = await asyncio.gather(*held)
    finally:
        server.should_exit = True
        await task
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert "in flight" in refused.json()["detail"]
    assert [a.status_code for a in served] == [200] * CAP
    assert middleware.stats.busy == 1
    assert await in_flight(backend) == 0
    assert await RateLimiter("served", backend).try_acquire(5 - CAP)  # only CAP spent


async def test_a_cancelled_request_gives_its_slot_back(backend: Any):
    app = App()
    app.hold = None
    middleware = await capped(backend, app)
    messages: asyncio.Queue[Any] = asyncio.Queue()
    await messages.put({"type": "http.request", "body": b"", "more_body": False})
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/api",
        "raw_path": b"/api",
        "root_path": "",
        "query_string": b"",
        "headers": [],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
        "scheme": "http",
        "http_version": "1.1",
        "asgi": {"version": "3.0"},
    }

    async def send(message: Any) -> None:
        pass

    request = asyncio.ensure_future(middleware(scope, messages.get, send))
    await until(lambda: in_flight(backend), lambda n: n == 1, "the slot taken")
    await cancelled(request)
    await until(lambda: in_flight(backend), lambda n: n == 0, "the slot back")


def test_concurrency_must_be_a_concurrency_limiter() -> None:
    with pytest.raises(InvalidArgumentError):
        RateLimitMiddleware(
            App().starlette(), backend=MemoryBackend(), rules=[], concurrency=object()
        )
