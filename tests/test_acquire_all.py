"""``aiolimit.acquire_all``: several limiters at once, all or nothing, on every backend; the
one path every surface takes (the middleware's grants reach the observer); a block set by any
process stops reservations made before it; ``ensure_rate``."""

from __future__ import annotations

import asyncio
import collections
import uuid
from typing import Any

import httpx
import pytest
from conformance import cancelled, new_client, now, tolerance, until, writes_paused
from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

import aiolimit
from aiolimit import (
    InvalidArgumentError,
    MemoryBackend,
    Observer,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
)
from aiolimit.asgi import RateLimitMiddleware, Rule, client_ip
from tools import LocalRedis

OVERALL, PER_CLIENT = RateType.OVERALL, RateType.PER_CLIENT
looptime = pytest.mark.looptime


class Counts(Observer):
    def __init__(self) -> None:
        self.grants: collections.Counter[str] = collections.Counter()
        self.refusals: collections.Counter[str] = collections.Counter()

    def granted(self, name: str, permits: int, waited: float) -> None:
        self.grants[name] += permits

    def refused(self, name: str, permits: int) -> None:
        self.refusals[name] += 1


@pytest.fixture
def counts() -> Any:
    observer = Counts()
    previous = aiolimit.observe(observer)
    yield observer
    aiolimit.observe(previous)


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


def client(app: Any, ip: str = "203.0.113.7") -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app, client=(ip, 50000)), base_url="http://test"
    )


# -- the one path ---------------------------------------------------------------------------------


@looptime
async def test_the_middlewares_grants_and_refusals_reach_the_observer(counts: Counts) -> None:
    app = RateLimitMiddleware(
        Starlette(routes=[Route("/", hello)]),
        backend=MemoryBackend(),
        rules=[Rule("mw-global", "10/second"), Rule("mw-client", "5/second", key=client_ip)],
    )
    async with client(app) as http:
        answers = [(await http.get("/")).status_code for _ in range(6)]
    assert answers == [200] * 5 + [429]
    assert counts.grants == {"mw-global": 5, "mw-client": 5}
    assert counts.refusals == {"mw-global": 1, "mw-client": 1}


async def test_acquire_all_takes_from_every_limiter_or_from_none(store, name, counts) -> None:
    everyone = RateLimiter(f"{name}-all", store.backend())
    per_user = RateLimiter(f"{name}-user", store.backend())
    await everyone.set_rate(RateLimiterConfig.build(OVERALL, 10, 60))
    await per_user.set_rate(RateLimiterConfig.build(PER_CLIENT, 2, 60))
    alice = per_user.for_client("alice")

    for _ in range(2):
        assert await aiolimit.acquire_all([(everyone, 1), (alice, 1)])
    refused = await aiolimit.acquire_all([(everyone, 1), (alice, 1)])
    assert not refused
    assert 59 < refused.retry_after <= 60
    assert await everyone.available_permits() == 8  # the refusal handed its grant back
    assert await aiolimit.acquire_all([(everyone, 3), (per_user.for_client("bob"), 2)])
    assert await everyone.available_permits() == 5
    assert counts.grants == {f"{name}-all": 5, f"{name}-user": 4}
    assert counts.refusals == {f"{name}-all": 1, f"{name}-user": 1}


async def test_release_hands_back_exactly_the_acquired_grants(store, name) -> None:
    first = RateLimiter(f"{name}-a", store.backend())
    second = RateLimiter(f"{name}-b", store.backend())
    await first.set_rate(RateLimiterConfig.build(OVERALL, 5, 60))
    await second.set_rate(RateLimiterConfig.build(OVERALL, 5, 60))
    acquired = await aiolimit.acquire_all([(first, 2), (second, 3)])
    assert acquired
    await acquired.release()
    await acquired.release()  # once only
    assert (await first.available_permits(), await second.available_permits()) == (5, 5)


@looptime
async def test_acquire_all_sleeps_until_the_last_reservation_starts() -> None:
    backend = MemoryBackend()
    fast, slow = RateLimiter("fast", backend), RateLimiter("slow", backend)
    await fast.set_rate(RateLimiterConfig.build(OVERALL, 10, 1))
    await slow.set_rate(RateLimiterConfig.build(OVERALL, 1, 2))
    assert await slow.try_acquire()
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert not await aiolimit.acquire_all([(fast, 1), (slow, 1)], timeout=1)
    assert await fast.available_permits() == 10
    acquired = await aiolimit.acquire_all([(fast, 1), (slow, 1)], timeout=2)
    assert acquired
    assert loop.time() - start == pytest.approx(2, abs=0.01)
    assert acquired.waited == pytest.approx(2, abs=0.01)


def test_acquire_all_refuses_bad_requests() -> None:
    limiter = RateLimiter("x", MemoryBackend())

    async def run(requests: Any, **options: Any) -> None:
        await aiolimit.acquire_all(requests, **options)

    for requests in ([], [limiter], [(limiter, 0)], [(limiter, 1), (limiter, 1)], [("x", 1)]):
        with pytest.raises(InvalidArgumentError):
            asyncio.run(run(requests))
    with pytest.raises(InvalidArgumentError):
        asyncio.run(run([(limiter, 1)], timeout=-1))


# -- blocks from anywhere ------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_block_set_by_another_process_stops_reservations_made_before_it(store, name):
    limiter = RateLimiter(name, store.backend())
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 10, 1))
    start = now()
    grants: list[float] = []

    async def caller() -> None:
        assert await limiter.try_acquire(timeout=None)
        grants.append(now() - start)

    tasks = [asyncio.ensure_future(caller()) for _ in range(14)]
    for _ in range(500):  # until the first ten are granted (at once)
        if len(grants) >= 10:
            break
        await asyncio.sleep(0.01)
    # Another process (the CLI) blocks the limiter: this process never called block().
    other = new_client(store)
    blocked_at = now() - start  # (the block starts between this and its reply)
    assert await other.block(name, 1_500_000) > 0
    await asyncio.gather(*tasks)
    late = sorted(grants)[10:]
    assert len(late) == 4
    earliest = blocked_at + 1.5 - tolerance(store).early
    assert all(when >= earliest for when in late), (blocked_at, late)


# -- ensure_rate ---------------------------------------------------------------------------------


async def test_ensure_rate_writes_only_when_the_stored_config_differs(store, name) -> None:
    limiter = RateLimiter(name, store.backend())
    assert await limiter.ensure_rate(RateLimiterConfig.build(OVERALL, "5/minute"))
    assert not await limiter.ensure_rate(RateLimiterConfig.build(OVERALL, "5/minute"))
    assert await limiter.try_acquire(2)
    assert await limiter.ensure_rate(
        RateLimiterConfig.build(OVERALL, "6/minute")
    )  # rewritten, the grants kept
    assert await limiter.available_permits() == 4
    config = await limiter.get_config()
    assert config == RateLimiterConfig(OVERALL, 6, config.interval if config else None)


# -- several limiters' attempts in flight at once (Backend.start_acquire) ---------------------


@pytest.mark.parametrize("paused_first", [False, True], ids=["answered-first", "answered-second"])
async def test_cancelled_while_one_store_answered_and_the_other_is_paused_holds_nothing(
    redis_server: LocalRedis, valkey_server: LocalRedis, paused_first: bool
) -> None:
    # Two limiters on two servers: one answers, the other is paused, and the caller is
    # cancelled meanwhile. An answer awaited already (answered first) or one that came but
    # was never awaited (answered second) hands its grant back, and so does the late one.
    answering, pausing = Redis.from_url(redis_server.url), Redis.from_url(valkey_server.url)
    quick = RateLimiter(f"all-{uuid.uuid4().hex[:8]}", RedisBackend(answering))
    slow = RateLimiter(f"all-{uuid.uuid4().hex[:8]}", RedisBackend(pausing))
    for limiter in (quick, slow):
        await limiter.set_rate(RateLimiterConfig.build(OVERALL, 5, 60))
    pairs = [(slow, 1), (quick, 1)] if paused_first else [(quick, 1), (slow, 1)]
    admin = Redis.from_url(valkey_server.url)
    async with writes_paused(admin):
        call = asyncio.ensure_future(aiolimit.acquire_all(pairs))
        await until(quick.available_permits, lambda left: left == 4, "quick's grant")
        await cancelled(call)

    async def both() -> tuple[int, int]:
        return await quick.available_permits(), await slow.available_permits()

    await until(both, lambda left: left == (5, 5), "the hand-backs")
    for redis in (answering, pausing, admin):
        await redis.aclose()


async def test_several_limiters_on_one_client_share_one_round_trip(redis_server) -> None:
    redis = Redis.from_url(redis_server.url)
    limiters = [RateLimiter(f"all-{uuid.uuid4().hex[:8]}", RedisBackend(redis)) for _ in range(3)]
    for limiter in limiters:
        await limiter.set_rate(RateLimiterConfig.build(OVERALL, 5, 60))
        assert await limiter.try_acquire()  # (the backend has learnt the rate type)

    async def scripts_run() -> int:
        stats = await redis.info("commandstats")
        return sum(
            v["calls"]
            for k, v in stats.items()
            if k.startswith(("cmdstat_evalsha", "cmdstat_fcall"))
        )

    before = await scripts_run()
    assert await aiolimit.acquire_all([(limiter, 1) for limiter in limiters])
    assert await scripts_run() - before == 1  # one acquire_many call for the three
    assert [await limiter.available_permits() for limiter in limiters] == [3, 3, 3]
    await redis.aclose()


# -- which limiters are the same one --------------------------------------------------------------


async def test_the_same_name_and_client_on_two_memory_stores_are_two_limiters() -> None:
    first = RateLimiter("twin", MemoryBackend(client_id="c"))
    second = RateLimiter("twin", MemoryBackend(client_id="c"))
    for limiter in (first, second):
        await limiter.set_rate(RateLimiterConfig.build(OVERALL, 1, 60))
    assert await aiolimit.acquire_all([(first, 1), (second, 1)])
    assert [await first.available_permits(), await second.available_permits()] == [0, 0]
    same = RateLimiter("twin", first.backend.with_client("c"))  # one store: the same limiter
    with pytest.raises(InvalidArgumentError, match="twice"):
        await aiolimit.acquire_all([(first, 1), (same, 1)])


async def test_two_redis_stores_are_told_apart_by_server_and_prefix(
    redis_server: LocalRedis, valkey_server: LocalRedis
) -> None:
    redis, again = Redis.from_url(redis_server.url), Redis.from_url(redis_server.url)
    valkey = Redis.from_url(valkey_server.url)
    name = f"twin-{uuid.uuid4().hex[:8]}"
    try:
        backends = [
            RedisBackend(redis, client_id="c"),
            RedisBackend(redis, client_id="c", prefix="other:"),  # another key space
            RedisBackend(valkey, client_id="c"),  # another server
        ]
        limiters = [RateLimiter(name, backend) for backend in backends]
        for limiter in limiters:
            await limiter.set_rate(RateLimiterConfig.build(OVERALL, 1, 60))
        assert await aiolimit.acquire_all([(limiter, 1) for limiter in limiters])
        assert [await limiter.available_permits() for limiter in limiters] == [0, 0, 0]
        # Another client of the same server, with the same prefix: the same limiter.
        same = RateLimiter(name, RedisBackend(again, client_id="c"))
        with pytest.raises(InvalidArgumentError, match="twice"):
            await aiolimit.acquire_all([(limiters[0], 1), (same, 1)])
    finally:
        for client in (redis, again, valkey):
            await client.aclose()
