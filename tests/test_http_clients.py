"""The httpx transport and the aiohttp middleware against a real local HTTP server (aiohttp's)
that answers 429 with Retry-After: a permit before every request, a pause every caller obeys,
one retry after it.

Pauses here are tenths of a second (Retry-After read as a decimal), so these tests run in real
time yet take about a second each at most.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from conformance import Tolerance
from flavours import Flavour
from redis.asyncio import Redis

from aiolimit import (
    InvalidArgumentError,
    MemoryBackend,
    RateLimited,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
)
from aiolimit._calls import retry_after_seconds
from aiolimit.aiohttp import RateLimitedClientMiddleware
from aiolimit.httpx import RateLimitedTransport
from tools import LocalRedis, free_port


class Partner:
    """A partner API on 127.0.0.1: records when each request arrived, and answers the next
    ``refusals`` requests with ``status`` and ``Retry-After: retry_after``."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []
        self.refusals = 0
        self.status = 429
        self.retry_after = "0.3"
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.arrivals.append(time.monotonic())
        if self.refusals:
            self.refusals -= 1
            return web.json_response(
                {"detail": "slow down"},
                status=self.status,
                headers={"Retry-After": self.retry_after},
            )
        return web.json_response({"n": len(self.arrivals)})


@pytest.fixture
async def partner() -> AsyncIterator[Partner]:
    state = Partner()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", state.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    state.url = f"http://127.0.0.1:{port}"
    yield state
    await runner.cleanup()


async def limiter_of(backend: Any, rate: int = 100, name: str = "partner") -> RateLimiter:
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, rate, 60))
    return limiter


def httpx_client(limiter: RateLimiter, **options: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=RateLimitedTransport(limiter, **options))


# -- Retry-After ----------------------------------------------------------------------------------


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_seconds("120") == 120.0
    assert retry_after_seconds(" 0.25 ") == 0.25
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412500.0) == 0.0
    for unreadable in (
        None,
        "",
        "soon",
        "-5",
        "nan",
        "inf",
        "-inf",
        "1e9",
        "0x10",
        "\x1b[2J",
        "\u0663",
    ):
        assert retry_after_seconds(unreadable) is None
    ten_years = 3650 * 86400
    assert retry_after_seconds("9" * 400) == ten_years  # past any float: the longest
    assert retry_after_seconds("Fri, 31 Dec 9999 23:59:59 GMT") == ten_years
    assert retry_after_seconds("Fri, 31 Dec 99999 23:59:59 GMT") is None


# -- httpx --------------------------------------------------------------------------------------


async def test_httpx_takes_a_permit_per_request_and_raises_rate_limited_past_the_timeout(
    partner: Partner, flavour: Flavour
) -> None:
    limiter = await limiter_of(MemoryBackend(), rate=3)
    async with flavour.client(flavour.transport(limiter, timeout=0.1)) as client:
        answers = [await client.get(partner.url) for _ in range(3)]
        with pytest.raises(RateLimited) as refused:
            await client.get(partner.url)
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert len(partner.arrivals) == 3  # the fourth never left
    assert refused.value.name == "partner"
    assert 59 < refused.value.retry_after <= 60


@pytest.mark.slow
async def test_httpx_obeys_a_429_pauses_every_caller_and_retries_once(
    partner: Partner, flavour: Flavour
) -> None:
    backend = MemoryBackend()
    limiter = await limiter_of(backend)
    partner.refusals = 1
    async with (
        flavour.client(flavour.transport(limiter)) as first,
        flavour.client(flavour.transport(limiter)) as second,
    ):
        answer = await first.get(partner.url)
        assert answer.status_code == 200  # the retry, after the pause
        assert answer.json() == {"n": 2}
        refused_at, retried_at = partner.arrivals
        assert retried_at - refused_at >= 0.29
        # another client of the limiter starting during a new pause waits for it too
        partner.refusals = 1
        task = asyncio.ensure_future(first.get(partner.url))
        await asyncio.sleep(0.1)
        started = time.monotonic()
        assert (await second.get(partner.url)).status_code == 200
        assert time.monotonic() - started >= 0.15
        assert (await task).status_code == 200
    assert await limiter.available_permits() == 100 - 5  # every request took its permit


@pytest.mark.slow
async def test_httpx_with_retry_off_returns_the_429_and_still_pauses(partner: Partner) -> None:
    limiter = await limiter_of(MemoryBackend())
    partner.refusals, partner.status = 1, 503
    async with httpx_client(limiter, retry=False) as client:
        answer = await client.get(partner.url)
        assert answer.status_code == 503
        started = time.monotonic()
        assert (await client.get(partner.url)).status_code == 200
    assert time.monotonic() - started >= 0.25


@pytest.mark.slow
async def test_httpx_retries_once_only_and_not_without_retry_after(partner: Partner) -> None:
    limiter = await limiter_of(MemoryBackend())
    partner.refusals, partner.retry_after = 5, "0.1"
    async with httpx_client(limiter) as client:
        assert (await client.get(partner.url)).status_code == 429
        assert len(partner.arrivals) == 2
        partner.retry_after = "whenever"  # unreadable: no pause, no retry
        assert (await client.get(partner.url)).status_code == 429
        assert len(partner.arrivals) == 3


async def test_httpx_does_not_resend_a_streamed_body(partner: Partner, flavour: Flavour) -> None:
    limiter = await limiter_of(MemoryBackend())
    partner.refusals = 1

    async def body() -> AsyncIterator[bytes]:
        yield b"once"

    async with flavour.client(flavour.transport(limiter)) as client:
        answer = await client.post(partner.url, content=body())
    assert answer.status_code == 429
    assert len(partner.arrivals) == 1


async def test_a_pause_longer_than_the_timeout_raises_rate_limited(partner: Partner) -> None:
    limiter = await limiter_of(MemoryBackend())
    await limiter.pause(30)
    async with httpx_client(limiter, timeout=1) as client:
        with pytest.raises(RateLimited) as refused:
            await client.get(partner.url)
    assert 29 < refused.value.retry_after <= 30
    assert partner.arrivals == []


# -- aiohttp ------------------------------------------------------------------------------------


def session(limiter: RateLimiter, **options: Any) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(middlewares=(RateLimitedClientMiddleware(limiter, **options),))


async def test_aiohttp_takes_a_permit_per_request_and_raises_rate_limited(
    partner: Partner,
) -> None:
    limiter = await limiter_of(MemoryBackend(), rate=2)
    async with session(limiter, timeout=0) as client:
        for _ in range(2):
            async with client.get(partner.url) as answer:
                assert answer.status == 200
        with pytest.raises(RateLimited):
            await client.get(partner.url)
    assert len(partner.arrivals) == 2


async def test_aiohttp_obeys_a_429_and_retries_once_after_the_pause(partner: Partner) -> None:
    limiter = await limiter_of(MemoryBackend())
    partner.refusals, partner.retry_after = 1, "0.3"
    async with session(limiter) as client, client.get(partner.url) as answer:
        assert answer.status == 200
        assert await answer.json() == {"n": 2}
    refused_at, retried_at = partner.arrivals
    assert retried_at - refused_at >= 0.29
    partner.refusals = 1
    async with session(limiter, retry=False) as client, client.get(partner.url) as answer:
        assert answer.status == 429


# -- several processes: the pause lives in Redis --------------------------------------------------


@pytest.mark.slow
async def test_a_pause_reaches_every_process_through_redis(
    partner: Partner, redis_server: LocalRedis
) -> None:
    # Two Redis clients and two backends: what two processes would have.
    clients = [Redis.from_url(redis_server.url) for _ in range(2)]
    await clients[0].flushall()
    limiters: list[RateLimiter] = [
        await limiter_of(RedisBackend(redis), name="shared-partner") for redis in clients
    ]
    partner.refusals, partner.retry_after = 1, "1"
    make: Callable[[RateLimiter], httpx.AsyncClient] = httpx_client
    try:
        async with make(limiters[0]) as one, make(limiters[1]) as other:
            first = asyncio.ensure_future(one.get(partner.url))
            while not partner.arrivals:  # noqa: ASYNC110 - the server has no event for it
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            started = time.monotonic()
            assert (await other.get(partner.url)).status_code == 200
            assert time.monotonic() - started >= 0.8  # it waited for the other's pause
            assert (await first).status_code == 200
        assert await limiters[1].backend.block(limiters[1].name, None) == 0  # it is over
    finally:
        for redis in clients:
            await redis.aclose()


# -- hostile Retry-After: a pause is capped ------------------------------------------------------

FIFTEEN_MINUTES_US = 15 * 60 * 1_000_000
REAL_TIME = Tolerance(early=0.01, late=0.5)  # a local HTTP round trip on a loaded machine
HOSTILE_RETRY_AFTERS = (
    "999999999",
    "Fri, 31 Dec 9999 23:59:59 GMT",
    "9" * 400,  # delta-seconds past any float: still "a very long time", so capped
)


async def block_left_us(limiter: RateLimiter) -> int:
    return await limiter.backend.block(limiter.name, None)


@pytest.mark.slow
@pytest.mark.parametrize("retry_after", HOSTILE_RETRY_AFTERS)
async def test_httpx_caps_a_hostile_retry_after_at_fifteen_minutes_and_logs_it(
    partner: Partner, retry_after: str, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = await limiter_of(MemoryBackend())
    partner.refusals, partner.retry_after = 1, retry_after
    with caplog.at_level(logging.WARNING, logger="aiolimit"):
        async with httpx_client(limiter, retry=False) as client:
            assert (await client.get(partner.url)).status_code == 429
    assert FIFTEEN_MINUTES_US - 5_000_000 < await block_left_us(limiter) <= FIFTEEN_MINUTES_US
    [line] = [r.getMessage() for r in caplog.records if "Retry-After" in r.getMessage()]
    assert "partner" in line and "900" in line and "max_pause" in line


@pytest.mark.parametrize("retry_after", HOSTILE_RETRY_AFTERS)
async def test_aiohttp_caps_a_hostile_retry_after_at_fifteen_minutes(
    partner: Partner, retry_after: str
) -> None:
    limiter = await limiter_of(MemoryBackend())
    partner.refusals, partner.retry_after = 1, retry_after
    async with session(limiter, retry=False) as client, client.get(partner.url) as answer:
        assert answer.status == 429
    assert FIFTEEN_MINUTES_US - 5_000_000 < await block_left_us(limiter) <= FIFTEEN_MINUTES_US


@pytest.mark.slow
async def test_max_pause_is_configurable_on_both_clients_and_the_retry_follows_it(
    partner: Partner,
) -> None:
    limiter = await limiter_of(MemoryBackend())
    partner.refusals, partner.retry_after = 1, "999999999"
    async with httpx_client(limiter, max_pause=0.3) as client:
        answer = await client.get(partner.url)
    assert answer.status_code == 200  # paused 0.3 s, not 31 years, then retried
    refused_at, retried_at = partner.arrivals
    REAL_TIME.check(retried_at - refused_at, 0.3, "the retry")
    assert await block_left_us(limiter) == 0

    partner.arrivals.clear()
    partner.refusals = 1
    async with (
        session(limiter, max_pause=timedelta(seconds=0.3)) as client,
        client.get(partner.url) as response,
    ):
        assert response.status == 200
    refused_at, retried_at = partner.arrivals
    REAL_TIME.check(retried_at - refused_at, 0.3, "the retry")

    async with session(limiter, max_pause=3600, retry=False) as client:
        partner.refusals = 1
        async with client.get(partner.url) as response:
            assert response.status == 429
    assert 3595_000_000 < await block_left_us(limiter) <= 3600_000_000


async def test_a_hostile_retry_after_on_redis_blocks_every_process_for_the_cap_only(
    partner: Partner, redis_server: LocalRedis
) -> None:
    clients = [Redis.from_url(redis_server.url) for _ in range(2)]  # two processes' clients
    try:
        limiter = await limiter_of(RedisBackend(clients[0]), name="hostile-partner")
        partner.refusals, partner.retry_after = 1, "Fri, 31 Dec 9999 23:59:59 GMT"
        async with httpx_client(limiter, retry=False) as client:
            assert (await client.get(partner.url)).status_code == 429
        other = RateLimiter("hostile-partner", RedisBackend(clients[1]))
        left = await block_left_us(other)
        assert FIFTEEN_MINUTES_US - 5_000_000 < left <= FIFTEEN_MINUTES_US
    finally:
        for redis in clients:
            await redis.aclose()


@pytest.mark.parametrize(
    "retry_after", ["-5", "nan", "NaN", "inf", "-inf", "1e9", "0x10", "", "soon"]
)
async def test_a_negative_or_unreadable_retry_after_neither_pauses_nor_retries(
    partner: Partner, retry_after: str
) -> None:
    limiter = await limiter_of(MemoryBackend())
    partner.refusals, partner.retry_after = 1, retry_after
    async with httpx_client(limiter) as client:
        assert (await client.get(partner.url)).status_code == 429
    async with session(limiter) as client:
        partner.refusals = 1
        async with client.get(partner.url) as response:
            assert response.status == 429
    assert len(partner.arrivals) == 2  # one each: no retry
    assert await block_left_us(limiter) == 0


def test_bad_max_pause_is_refused() -> None:
    limiter = RateLimiter("partner", MemoryBackend())
    for bad in (-1, float("nan"), "900", timedelta(days=4000)):
        with pytest.raises(InvalidArgumentError):
            RateLimitedTransport(limiter, max_pause=bad)
        with pytest.raises(InvalidArgumentError):
            RateLimitedClientMiddleware(limiter, max_pause=bad)
