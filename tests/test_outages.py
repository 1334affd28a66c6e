"""Store outages on the permit path: one failure answers every waiter, then calls fail at once
for a short, growing back-off while one call probes (the circuit breaker), for the limiter's
own calls and for the middleware."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import pytest
from conformance import LoopLag, Tolerance, now
from flaky import Flaky
from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

import aiolimit
from aiolimit import (
    BackendError,
    MemoryBackend,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
)
from aiolimit.asgi import RateLimitMiddleware, Rule, client_ip
from aiolimit.backends.base import Attempt
from tools import LocalRedis, free_port

looptime = pytest.mark.looptime


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


def app_on(backend: Any, **options: Any) -> RateLimitMiddleware:
    return RateLimitMiddleware(
        Starlette(routes=[Route("/", hello)]),
        backend=backend,
        rules=[Rule("out-global", "100/second"), Rule("out-client", "10/second", key=client_ip)],
        **options,
    )


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app, client=("203.0.113.7", 5000)), base_url="http://t"
    )


@looptime
async def test_after_a_failure_calls_fail_at_once_while_one_call_probes() -> None:
    backend = Flaky()
    limiter = RateLimiter("probed", backend)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1000, 1))
    backend.down = True
    loop = asyncio.get_running_loop()
    start = loop.time()
    failures = 0
    while loop.time() - start < 10:  # a caller retrying every 10 ms for 10 s
        with pytest.raises(BackendError, match="unreachable"):
            await limiter.try_acquire()
        failures += 1
        await asyncio.sleep(0.01)
    # Failures at 0 (back-off 0.5 s), probes at about 1, 2, 3.5, 6.5 (back-offs 1, 2, 4 s):
    # a handful of calls reached the store, each other one failed at once.
    assert 4 <= backend.reached <= 6, backend.reached
    assert failures > 500
    backend.down = False
    await asyncio.sleep(aiolimit.breaker_of(backend, "probed").max_backoff)
    assert await limiter.try_acquire()  # the probe finds the store up: closed again
    reached = backend.reached
    assert all([await limiter.try_acquire() for _ in range(10)])
    assert backend.reached == reached + 10


@looptime
async def test_a_probe_cancelled_lets_the_next_call_probe() -> None:
    backend = Flaky()
    limiter = RateLimiter("cancelled-probe", backend)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1000, 1))
    backend.down = True
    with pytest.raises(BackendError):
        await limiter.try_acquire()
    await asyncio.sleep(1)
    probe = asyncio.ensure_future(limiter.try_acquire())
    await asyncio.sleep(0.1)
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    backend.down = False
    assert await limiter.try_acquire()


@pytest.mark.slow
async def test_a_killed_redis_server_costs_one_failure_then_calls_fail_at_once(
    loop_lag: LoopLag,
) -> None:
    with LocalRedis() as server:
        redis = Redis.from_url(server.url)
        try:
            limiter = RateLimiter("killed", RedisBackend(redis, timeout=2))
            await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1000, 60))
            assert await limiter.try_acquire()
            server.kill()
            with pytest.raises(BackendError):
                await limiter.try_acquire()
            start = now()
            for _ in range(20):
                with pytest.raises(BackendError):
                    await limiter.try_acquire()
            Tolerance(0.0, 0.2, loop_lag).check(now(), start, "20 calls failing at once")
            server.start()  # a fresh server: the config is written again
            deadline = time.monotonic() + 3  # the first back-off is 0.5 s
            while True:
                try:
                    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1000, 60))
                    assert await limiter.try_acquire()
                    break
                except BackendError:
                    assert time.monotonic() < deadline, "never closed again"
                    await asyncio.sleep(0.05)
        finally:
            await redis.aclose()


@pytest.mark.slow
async def test_redis_down_before_the_rules_are_configured_one_failure_answers_every_waiter(
    caplog: pytest.LogCaptureFixture, loop_lag: LoopLag
) -> None:
    caplog.set_level(logging.INFO, logger="aiolimit")
    redis = Redis.from_url(f"redis://127.0.0.1:{free_port()}")  # nothing listens there
    try:
        # One call's deadline, on another backend (its own breaker).
        start = time.monotonic()
        with pytest.raises(BackendError):
            await RateLimiter("alone", RedisBackend(redis, timeout=1)).get_config()
        one_call = time.monotonic() - start

        app = app_on(RedisBackend(redis, timeout=1))
        async with client(app) as http:

            async def timed() -> tuple[int, float]:
                began = time.monotonic()
                status = (await http.get("/")).status_code
                return status, time.monotonic() - began

            answers = await asyncio.gather(*(timed() for _ in range(10)))
            assert [status for status, _ in answers] == [503] * 10
            longest = max(took for _, took in answers)
            assert longest < 2 * one_call + 0.5, (one_call, sorted(t for _, t in answers))
            # Then, for the breaker's back-off, every request is answered at once.
            start = now()
            assert [(await http.get("/")).status_code for _ in range(20)] == [503] * 20
            Tolerance(0.0, 0.5, loop_lag).check(now(), start, "20 requests answered at once")
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    finally:
        await redis.aclose()


@looptime
async def test_a_store_that_answers_with_an_error_does_not_open_the_breaker() -> None:
    class Refusing(MemoryBackend):
        reached = 0

        async def try_acquire(
            self, name: str, permits: int, max_wait_us: int | None = 0
        ) -> Attempt:
            self.reached += 1
            raise BackendError("Redis refused the acquire script", outage=False)

    backend = Refusing()
    limiter = RateLimiter("refusing", backend)
    for _ in range(3):
        with pytest.raises(BackendError, match="refused"):
            await limiter.try_acquire()
    assert backend.reached == 3


@looptime
@pytest.mark.parametrize("how", ["try_acquire", "acquire_all"])
async def test_a_call_failing_fast_lets_the_event_loop_run_other_tasks(how: str) -> None:
    # A caller that retries at once in a loop while the breaker is open must not freeze the
    # event loop for the whole back-off: each failing call yields once.
    backend = Flaky()
    limiter, other = RateLimiter("yields", backend), RateLimiter("yields-too", backend)
    for each in (limiter, other):
        await each.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1000, 1))
    backend.down = True
    with pytest.raises(BackendError):
        await limiter.try_acquire()  # opens the breaker
    ticks = 0

    async def ticking() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.ensure_future(ticking())
    await asyncio.sleep(0)
    for _ in range(100):
        with pytest.raises(BackendError, match="fail at once"):
            if how == "try_acquire":
                await limiter.try_acquire()
            else:
                await aiolimit.acquire_all([(limiter, 1), (other, 1)])
    ticker.cancel()
    assert ticks >= 100
    assert backend.reached == 1  # every one of them failed fast
