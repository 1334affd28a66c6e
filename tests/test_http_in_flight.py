"""The httpx transport and the aiohttp middleware with a concurrency limiter beside the rate
limiter, against a real local HTTP server that counts the requests in flight: never more than
the cap, the rate kept, the slot held until the body is closed, a lost lease raised."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from conformance import cancelled, until
from flavours import Flavour
from redis.asyncio import Redis

from aiolimit import (
    ConcurrencyLimiter,
    LeaseLostError,
    MemoryBackend,
    RateLimited,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
)
from aiolimit.aiohttp import RateLimitedClientMiddleware
from aiolimit.httpx import RateLimitedTransport
from tools import LocalRedis, free_port

CAP = 3


class Server:
    """A partner on 127.0.0.1 that counts requests in flight (the most at once) and holds
    each one ``hold`` seconds, or until ``release`` is set when ``hold`` is None."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most = 0
        self.served = 0
        self.hold: float | None = 0.05
        self.status = 200
        self.headers: dict[str, str] = {}
        self.release = asyncio.Event()
        self.arrived = asyncio.Event()
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.arrived.set()
        try:
            if self.hold is None:
                await self.release.wait()
            else:
                await asyncio.sleep(self.hold)
            self.served += 1
            return web.Response(text="x" * 10_000, status=self.status, headers=self.headers)
        finally:
            self.in_flight -= 1

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """Headers and a first chunk at once, the rest when ``release`` is set."""
        response = web.StreamResponse(status=self.status, headers=self.headers)
        await response.prepare(request)
        await response.write(b"first ")
        await self.release.wait()
        await response.write(b"last")
        await response.write_eof()
        return response


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    state = Server()
    app = web.Application()
    app.router.add_get("/stream", state.stream)
    app.router.add_route("*", "/{tail:.*}", state.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    state.url = f"http://127.0.0.1:{port}"
    yield state
    state.release.set()
    await runner.cleanup()


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


async def limiters(backend: Any, rate: int = 10, lease: float = 30.0) -> tuple[Any, Any]:
    rpm = RateLimiter("partner-rpm", backend)
    await rpm.set_rate(RateLimiterConfig.build(RateType.OVERALL, rate, 60))
    sem = ConcurrencyLimiter("partner-slots", backend)
    await sem.set_limit(CAP, lease=lease)
    return rpm, sem


async def in_flight(sem: ConcurrencyLimiter) -> int:
    snapshot = await sem.leases()
    assert snapshot is not None
    return snapshot.in_flight


async def test_httpx_never_exceeds_the_cap_and_keeps_the_rate(
    backend: Any, server: Server, flavour: Flavour
):
    rpm, sem = await limiters(backend, rate=10)
    transport = flavour.transport(rpm, concurrency=sem, timeout=5)  # (the default inner one)
    async with flavour.client(transport) as client:
        answers = await asyncio.gather(
            *(client.get(server.url) for _ in range(12)), return_exceptions=True
        )
    refused = [a for a in answers if isinstance(a, RateLimited)]
    statuses = [a.status_code for a in answers if isinstance(a, flavour.httpx.Response)]
    assert statuses == [200] * 10
    assert len(refused) == 2 and {r.name for r in refused} == {"partner-rpm"}
    assert server.served == 10
    assert server.most == CAP  # the cap reached, never passed
    assert await in_flight(sem) == 0  # every slot back, the refused ones' too


async def test_aiohttp_never_exceeds_the_cap_and_keeps_the_rate(backend: Any, server: Server):
    rpm, sem = await limiters(backend, rate=10)
    middleware = RateLimitedClientMiddleware(rpm, concurrency=sem, timeout=5)

    async def get(session: aiohttp.ClientSession) -> int:
        async with session.get(server.url) as response:
            await response.read()
            return response.status

    async with aiohttp.ClientSession(middlewares=[middleware]) as session:
        answers = await asyncio.gather(*(get(session) for _ in range(12)), return_exceptions=True)
    refused = [a for a in answers if isinstance(a, RateLimited)]
    assert [a for a in answers if not isinstance(a, BaseException)] == [200] * 10
    assert len(refused) == 2
    assert server.served == 10
    assert server.most == CAP
    await until(lambda: in_flight(sem), lambda n: n == 0, "every slot back")


async def test_httpx_holds_the_slot_until_a_streamed_body_is_closed(
    backend: Any, server: Server, flavour: Flavour
):
    rpm, sem = await limiters(backend)
    transport = flavour.transport(rpm, concurrency=sem)
    async with flavour.client(transport) as client:
        async with client.stream("GET", server.url) as response:
            assert response.status_code == 200
            assert await in_flight(sem) == 1  # the body is not read yet
            await response.aread()
        assert await in_flight(sem) == 0
        assert (await client.get(server.url)).status_code == 200
        assert await in_flight(sem) == 0  # client.get reads and closes the body


async def test_aiohttp_holds_the_slot_until_the_response_is_released(backend: Any, server: Server):
    rpm, sem = await limiters(backend)
    middleware = RateLimitedClientMiddleware(rpm, concurrency=sem)
    async with aiohttp.ClientSession(middlewares=[middleware]) as session:
        async with session.get(server.url + "/stream") as response:
            assert await response.content.readexactly(6) == b"first "
            assert await in_flight(sem) == 1  # the body is still coming
            server.release.set()
            assert await response.read() == b"last"
            await until(lambda: in_flight(sem), lambda n: n == 0, "released at the body's end")
        server.release.clear()
        async with session.get(server.url + "/stream") as response:
            assert await in_flight(sem) == 1
        await until(lambda: in_flight(sem), lambda n: n == 0, "released with the response")


async def test_httpx_a_lease_lost_mid_request_raises_lease_lost_error(backend: Any, server: Server):
    rpm, sem = await limiters(backend, lease=0.3)
    server.hold = None  # the partner answers only when told
    transport = RateLimitedTransport(rpm, concurrency=sem)
    async with httpx.AsyncClient(transport=transport) as client:
        calling = asyncio.ensure_future(client.get(server.url))
        await server.arrived.wait()
        await sem.delete()  # the store forgets the lease: the next renewal finds it lost
        with pytest.raises(LeaseLostError):
            await asyncio.wait_for(calling, 5)
    assert server.served == 0


async def test_aiohttp_a_lease_lost_mid_request_raises_lease_lost_error(
    backend: Any, server: Server
):
    rpm, sem = await limiters(backend, lease=0.3)
    server.hold = None
    middleware = RateLimitedClientMiddleware(rpm, concurrency=sem)
    async with aiohttp.ClientSession(middlewares=[middleware]) as session:
        calling = asyncio.ensure_future(session.get(server.url))
        await server.arrived.wait()
        await sem.delete()
        with pytest.raises(LeaseLostError):
            await asyncio.wait_for(calling, 5)
    assert server.served == 0


async def test_no_slot_in_time_raises_rate_limited_and_spends_no_permit(
    backend: Any, server: Server
):
    rpm, sem = await limiters(backend, rate=10)
    held = [await sem.try_lease() for _ in range(CAP)]
    transport = RateLimitedTransport(rpm, concurrency=sem, timeout=0.2)
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(RateLimited) as refused:
            await client.get(server.url)
    assert refused.value.name == "partner-slots"
    assert server.served == 0
    assert await rpm.try_acquire(10)  # all ten permits still there
    for lease in held:
        assert lease is not None and await lease.release()


# -- a slot never outlives its caller (issue 35, items 3 and 4) ------------------------------


async def test_httpx_a_slot_held_while_the_rate_is_slept_out_is_never_shared(
    backend: Any, server: Server
):
    rpm = RateLimiter("partner-rpm", backend)
    await rpm.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1, 1))
    sem = ConcurrencyLimiter("partner-slots", backend)
    await sem.set_limit(1, lease=0.3)
    assert await rpm.try_acquire()  # the request's permit is 1 s away: three lease times
    transport = RateLimitedTransport(rpm, concurrency=sem)
    async with httpx.AsyncClient(transport=transport) as client:
        calling = asyncio.ensure_future(client.get(server.url))
        await until(lambda: in_flight(sem), lambda n: n == 1, "the slot taken")
        rival = asyncio.ensure_future(sem.try_lease(timeout=None))
        response = await calling
        assert response.status_code == 200
        assert not rival.done()  # no one else held the slot while the request waited
    lease = await asyncio.wait_for(rival, 5)
    assert lease is not None
    await lease.release()


class Stalled(RateLimiter):
    """A rate limiter whose ``cap_remaining`` (``stalls="sync"``: the headers' count) or
    ``pause`` (``"block"``: a 429's) waits until its caller is cancelled: a store that
    answers late, caught exactly then."""

    def __init__(self, name: str, backend: Any, stalls: str) -> None:
        super().__init__(name, backend)
        self.stalls = stalls
        self.stalled = asyncio.Event()

    async def _stall(self) -> None:
        self.stalled.set()
        await asyncio.Event().wait()

    async def cap_remaining(self, remaining: int, *, reset: Any) -> None:
        if self.stalls == "sync":
            await self._stall()
        await super().cap_remaining(remaining, reset=reset)

    async def pause(self, duration: Any) -> None:
        if self.stalls == "block":
            await self._stall()
        await super().pause(duration)


STALLS = {
    "sync": (200, {"x-ratelimit-remaining-requests": "5", "x-ratelimit-reset-requests": "1s"}),
    "block": (429, {"Retry-After": "1"}),
}


async def cancelled_while_stalled(
    get: Callable[[str], Awaitable[Any]], url: str, stalled: Stalled, sem: ConcurrencyLimiter
) -> None:
    """``get(url)`` cancelled while ``stalled`` stalls its caller, the response in hand;
    then its slot is free: none in flight, and a lease taken at once."""
    calling = asyncio.ensure_future(get(url))
    await asyncio.wait_for(stalled.stalled.wait(), 5)
    assert await in_flight(sem) == 1  # the body is still coming
    await cancelled(calling)
    await until(lambda: in_flight(sem), lambda n: n == 0, "the slot released")
    lease = await sem.try_lease(timeout=0)
    assert lease is not None
    await lease.release()


@pytest.mark.parametrize("client", ["httpx", "aiohttp"])
@pytest.mark.parametrize("stalls", sorted(STALLS))
async def test_a_caller_cancelled_after_the_response_came_leaves_no_slot_held(
    backend: Any, server: Server, stalls: str, client: str
):
    rpm = Stalled("partner-rpm", backend, stalls)
    await rpm.set_rate(RateLimiterConfig.build(RateType.OVERALL, 10, 60))
    sem = ConcurrencyLimiter("partner-slots", backend)
    await sem.set_limit(1, lease=30)
    server.status, server.headers = STALLS[stalls]
    url = server.url + "/stream"
    if client == "httpx":
        transport = RateLimitedTransport(rpm, concurrency=sem)
        async with httpx.AsyncClient(transport=transport) as http:
            await cancelled_while_stalled(http.get, url, rpm, sem)
    else:
        middleware = RateLimitedClientMiddleware(rpm, concurrency=sem)
        async with aiohttp.ClientSession(middlewares=[middleware]) as session:
            await cancelled_while_stalled(session.get, url, rpm, sem)


async def test_aiohttp_a_caller_cancelled_while_an_event_streams_tokens_sync_leaves_no_slot(
    backend: Any, server: Server
):
    rpm, sem = await limiters(backend)
    await sem.update_limit(1)
    tokens = Stalled("partner-tpm", backend, "sync")
    await tokens.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1000, 60))
    server.headers = {
        "Content-Type": "text/event-stream",
        "x-ratelimit-remaining-tokens": "500",
        "x-ratelimit-reset-tokens": "1s",
    }
    middleware = RateLimitedClientMiddleware(rpm, concurrency=sem, tokens=tokens)
    async with aiohttp.ClientSession(middlewares=[middleware]) as session:
        await cancelled_while_stalled(session.get, server.url + "/stream", tokens, sem)
