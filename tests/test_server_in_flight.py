"""``concurrency=`` on every server surface (the ASGI middleware, the aiohttp.web middleware,
the FastAPI dependency), through their real servers: with a limit of 1, one request is served
and the other refused (or queued up to ``wait``); the slot is held while the handler runs and
its body is sent (renewed meanwhile), and comes back after the answer, after a client that
left mid-answer, and after a handler that raised."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from conformance import until
from redis.asyncio import Redis
from surfaces import CHUNK, SURFACES, Handler, serving

from aiolimit import ConcurrencyLimiter, MemoryBackend, RateLimiter, RedisBackend
from aiolimit.aiohttp_web import RateLimitMiddleware as AiohttpMiddleware
from aiolimit.asgi import Rule
from aiolimit.errors import InvalidArgumentError
from aiolimit.fastapi import RateLimit
from tools import LocalRedis

SLOTS = "served-at-once"


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield MemoryBackend()
        return
    real: LocalRedis = request.getfixturevalue("redis_server")
    redis = Redis.from_url(real.url)
    await redis.flushall()
    backend = RedisBackend(redis)
    yield backend
    await backend.aclose()
    await redis.aclose()


def one_at_a_time(backend: Any, **options: Any) -> dict[str, Any]:
    """The surface's options: ``backend`` with a concurrency limit of 1, and ``options``."""
    slots = ConcurrencyLimiter(SLOTS, backend, limit=1, lease=options.pop("lease", 30))
    return {"backend": backend, "concurrency": slots, **options}


def rule() -> Rule:
    return Rule("served", "5/minute")


async def in_flight(backend: Any) -> int:
    snapshot = await ConcurrencyLimiter(SLOTS, backend).leases()
    return 0 if snapshot is None else snapshot.in_flight


async def slot_back(backend: Any) -> None:
    await until(lambda: in_flight(backend), lambda n: n == 0, "the slot back")


@pytest.mark.parametrize("surface", SURFACES)
async def test_limit_one_serves_one_refuses_the_other_and_frees_the_slot_after(
    surface: str, backend: Any
) -> None:
    handler = Handler("hold")
    async with (
        serving(surface, handler, rule=rule(), **one_at_a_time(backend)) as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        first = asyncio.ensure_future(http.get("/work"))
        await until(handler.count_in_flight, bool, "the first served")
        refused = await http.get("/work")
        handler.release.set()
        assert (await first).status_code == 200
        await slot_back(backend)
        again = await http.get("/work")
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert "in flight" in refused.json()["detail"]
    assert again.status_code == 200
    assert handler.most == 1 and handler.served == 2
    assert await RateLimiter("served", backend).try_acquire(3)  # the refused one spent none
    assert not await RateLimiter("served", backend).try_acquire(1)


@pytest.mark.parametrize("surface", SURFACES)
async def test_a_request_over_the_limit_waits_for_the_slot_up_to_wait(surface: str) -> None:
    backend = MemoryBackend()
    handler = Handler("hold")
    async with (
        serving(surface, handler, rule=rule(), **one_at_a_time(backend, wait=5)) as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        first = asyncio.ensure_future(http.get("/work"))
        await until(handler.count_in_flight, bool, "the first served")
        second = asyncio.ensure_future(http.get("/work"))
        snapshot = await until(
            lambda: ConcurrencyLimiter(SLOTS, backend).leases(),
            lambda s: s is not None and s.waiting == 1,
            "the second queued",
        )
        assert handler.served == 1 and snapshot is not None
        handler.release.set()
        answers = await asyncio.gather(first, second)
    assert [a.status_code for a in answers] == [200, 200]
    assert handler.most == 1


@pytest.mark.parametrize("surface", SURFACES)
async def test_the_slot_is_held_until_the_streamed_body_is_sent(surface: str) -> None:
    await hold_while_streaming(surface, lease=30, hold=0.0)


@pytest.mark.slow
@pytest.mark.parametrize("surface", SURFACES)
async def test_the_slot_is_renewed_while_the_handler_runs(surface: str) -> None:
    await hold_while_streaming(surface, lease=0.5, hold=1.2)  # held only if renewed


async def hold_while_streaming(surface: str, lease: float, hold: float) -> None:
    """A request whose body streams for ``hold`` s (and more) holds its slot all along: a
    second one meanwhile is refused; the slot is free once the body is sent."""
    backend = MemoryBackend()
    handler = Handler("stream")
    options = one_at_a_time(backend, lease=lease)
    async with (
        serving(surface, handler, rule=rule(), **options) as url,
        httpx.AsyncClient(base_url=url) as http,
        http.stream("GET", "/work") as streaming,
    ):
        chunks = streaming.aiter_raw()
        assert await anext(chunks) == CHUNK  # (the server sends what it has at once)
        await asyncio.sleep(hold)
        during = await http.get("/work")
        handler.release.set()
        async for _ in chunks:
            pass
        await slot_back(backend)
        after = await http.get("/work")
    assert during.status_code == 503
    assert after.status_code == 200


@pytest.mark.parametrize("surface", SURFACES)
async def test_the_slot_comes_back_after_the_client_leaves_mid_answer(surface: str) -> None:
    backend = MemoryBackend()
    handler = Handler("stream")
    async with serving(surface, handler, rule=rule(), **one_at_a_time(backend)) as url:
        await leave_after_the_first_chunk(url)
        await slot_back(backend)
    if surface != "aiohttp":  # (aiohttp leaves a payload's generator to the collector)
        assert handler.in_flight == 0  # the stream was stopped, not left running


@pytest.mark.parametrize("mode", ["hold", "stream"])
async def test_aiohttp_with_handler_cancellation_gives_the_slot_back_on_leaving(
    mode: str,
) -> None:
    backend = MemoryBackend()
    handler = Handler(mode)
    options = one_at_a_time(backend, handler_cancellation=True)
    async with serving("aiohttp", handler, rule=rule(), **options) as url:
        if mode == "hold":
            await leave_while_held(url, handler)
        else:
            await leave_after_the_first_chunk(url)
        await slot_back(backend)


@pytest.mark.parametrize("surface", SURFACES)
async def test_the_slot_comes_back_after_the_handler_raises(surface: str) -> None:
    backend = MemoryBackend()
    handler = Handler("raise")
    # (uvicorn closes a connection whose app raised: one connection per request)
    async with (
        serving(surface, handler, rule=rule(), **one_at_a_time(backend)) as url,
        httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_keepalive_connections=0)) as http,
    ):
        failed = await http.get("/work")
        await slot_back(backend)
        handler.mode = "ok"
        served = await http.get("/work")
    assert failed.status_code == 500
    assert served.status_code == 200


async def leave_after_the_first_chunk(url: str) -> None:
    """A GET whose client reads the first chunk of the body and closes the connection."""
    reader, writer = await request_raw(url)
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert CHUNK in await reader.readuntil(CHUNK)
    writer.close()
    await writer.wait_closed()


async def leave_while_held(url: str, handler: Handler) -> None:
    """A GET whose client closes the connection while the handler holds it."""
    _, writer = await request_raw(url)
    await until(handler.count_in_flight, bool, "the request served")
    writer.close()
    await writer.wait_closed()


async def request_raw(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    where = urlsplit(url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    writer.write(b"GET /work HTTP/1.1\r\nHost: test\r\n\r\n")
    await writer.drain()
    return reader, writer


@pytest.mark.parametrize("surface", ["aiohttp", "fastapi"])
def test_concurrency_must_be_a_concurrency_limiter(surface: str) -> None:
    with pytest.raises(InvalidArgumentError):
        if surface == "aiohttp":
            AiohttpMiddleware(backend=MemoryBackend(), rules=[], concurrency=object())  # type: ignore[arg-type]
        else:
            RateLimit("r", "1/second", backend=MemoryBackend(), concurrency=object())  # type: ignore[arg-type]


@pytest.mark.parametrize("surface", SURFACES)
async def test_a_lost_slot_cancels_the_handler_and_answers_500(surface: str) -> None:
    backend = MemoryBackend()
    handler = Handler("hold")
    options = one_at_a_time(backend, lease=0.3)
    async with (
        serving(surface, handler, rule=rule(), **options) as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        held = asyncio.ensure_future(http.get("/work"))
        await until(handler.count_in_flight, bool, "the request served")
        await ConcurrencyLimiter(SLOTS, backend).delete()  # its renewal finds it lost
        answer = await held
    assert answer.status_code == 500
    assert handler.in_flight == 0 and not handler.release.is_set()
