"""Which failures a limiter's circuit breaker counts, and how long it is remembered: a failure
is charged only to the breakers of the limiters whose store failed; an answering store (a
key holding foreign data, a config it cannot read) leaves them closed; an open breaker is
kept however many other names the backend sees, and idle ones are not kept at all."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
from collections.abc import AsyncIterator, Iterator

import pytest
from flaky import Flaky
from redis import exceptions as redis_errors
from redis.asyncio import Redis

import aiolimit
from aiolimit import (
    Backend,
    BackendError,
    BreakerPolicy,
    MemoryBackend,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
)
from aiolimit.backends.redis._errors import call_error
from tools import LocalRedis

OVERALL = RateType.OVERALL
looptime = pytest.mark.looptime
FAILS_AT_ONCE = "calls fail at once"


@pytest.fixture
def doomed_server() -> Iterator[LocalRedis]:
    """A second redis-server, of this test alone: the test stops it."""
    with LocalRedis() as server:
        yield server


@pytest.fixture
async def redis(redis_server: LocalRedis) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url)
    await client.flushall()
    try:
        yield client
    finally:
        await client.aclose()


def is_open(limiter: RateLimiter) -> bool:
    return aiolimit.breaker_of(limiter.backend, limiter.name).is_open


# -- a failure is charged to the store that failed ----------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("healthy_kind", ["memory", "redis"])
async def test_a_failing_server_opens_only_the_breakers_of_its_own_limiters(
    healthy_kind: str, redis: Redis, doomed_server: LocalRedis, name: str
) -> None:
    healthy: Backend = MemoryBackend() if healthy_kind == "memory" else RedisBackend(redis)
    doomed_redis = Redis.from_url(doomed_server.url)
    try:
        doomed = RedisBackend(doomed_redis, timeout=1)
        everyone = RateLimiter(f"{name}-everyone", healthy)
        per_route = RateLimiter(f"{name}-route", doomed)
        per_user = RateLimiter(f"{name}-user", doomed)
        for limiter in (everyone, per_route, per_user):
            await limiter.set_rate(RateLimiterConfig.build(OVERALL, 1000, 1))
        doomed_server.kill()

        with pytest.raises(BackendError, match="unreachable"):
            await aiolimit.acquire_all([(everyone, 1), (per_route, 1), (per_user, 1)])
        # One call carried both limiters of the failed server: both are charged.
        assert is_open(per_route) and is_open(per_user)
        assert not is_open(everyone)
        # The failed server's breaker fails the next call at once; the healthy limiter is
        # not charged for that either.
        with pytest.raises(BackendError, match=FAILS_AT_ONCE):
            await aiolimit.acquire_all([(everyone, 1), (per_route, 1)])
        assert not is_open(everyone)
        assert all([await everyone.try_acquire() for _ in range(20)])
    finally:
        await doomed_redis.aclose()


@looptime
async def test_a_probe_turned_away_by_another_limiters_open_breaker_is_not_charged() -> None:
    healthy, doomed = Flaky(), Flaky()
    everyone, per_user = RateLimiter("everyone", healthy), RateLimiter("per-user", doomed)
    for limiter in (everyone, per_user):
        await limiter.set_rate(RateLimiterConfig.build(OVERALL, 1000, 1))
    healthy.down = doomed.down = True
    for limiter in (everyone, per_user):  # each fails after 0.5 s: per-user's opens later
        with pytest.raises(BackendError, match="unreachable"):
            await limiter.try_acquire()
    healthy.down = False
    await asyncio.sleep(0.2)  # everyone's back-off has passed, per-user's has not

    # everyone's call would be its probe; per-user's open breaker turns the call away.
    with pytest.raises(BackendError, match=FAILS_AT_ONCE):
        await aiolimit.acquire_all([(everyone, 1), (per_user, 1)])
    reached = healthy.reached
    assert await everyone.try_acquire()  # its probe, at once: found the store up
    assert healthy.reached == reached + 1 and not is_open(everyone)

    await asyncio.sleep(aiolimit.breaker_of(doomed, "per-user").first_backoff)
    with pytest.raises(BackendError, match="unreachable"):  # per-user's probe fails
        await aiolimit.acquire_all([(everyone, 1), (per_user, 1)])
    assert not is_open(everyone)
    assert await everyone.try_acquire()


# -- an answering store is up --------------------------------------------------------------------


async def foreign_value(redis: Redis, backend: RedisBackend, name: str) -> None:
    await redis.set(backend.keys(name).value, "not a limiter's")


async def wrong_type_value(redis: Redis, backend: RedisBackend, name: str) -> None:
    await redis.delete(backend.keys(name).value)
    await redis.rpush(backend.keys(name).value, "a list")


async def unreadable_config(redis: Redis, backend: RedisBackend, name: str) -> None:
    await redis.hset(backend.keys(name).config, "rate", "many")


@pytest.mark.parametrize("spoil", [foreign_value, wrong_type_value, unreadable_config])
async def test_a_key_the_server_refuses_leaves_the_breaker_closed_and_its_repair_is_seen_at_once(
    spoil: object, redis: Redis, name: str
) -> None:
    backend = RedisBackend(redis)
    limiter = RateLimiter(name, backend)
    other = RateLimiter(f"{name}-other", backend)
    for each in (limiter, other):
        await each.set_rate(RateLimiterConfig.build(OVERALL, 1000, 1))
    assert await limiter.try_acquire()
    await spoil(redis, backend, name)  # type: ignore[operator]

    errors: list[BackendError] = []
    for call in (limiter.try_acquire, lambda: aiolimit.acquire_all([(other, 1), (limiter, 1)])):
        for _ in range(3):
            with pytest.raises(BackendError) as caught:
                await call()
            errors.append(caught.value)
    assert [FAILS_AT_ONCE in str(error) for error in errors] == [False] * 6, errors
    assert not is_open(limiter) and not is_open(other)
    assert not any(error.outage for error in errors)

    await limiter.delete()  # repaired
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 1000, 1))
    assert await limiter.try_acquire()
    assert await aiolimit.acquire_all([(other, 1), (limiter, 1)])


async def test_a_read_only_server_a_failover_under_way_opens_the_breaker(
    doomed_server: LocalRedis, name: str
) -> None:
    redis = Redis.from_url(doomed_server.url)
    try:
        limiter = RateLimiter(name, RedisBackend(redis))
        await limiter.set_rate(RateLimiterConfig.build(OVERALL, 1000, 1))
        # A replica of a master that is gone: it answers every write READONLY.
        await redis.execute_command("REPLICAOF", "127.0.0.1", "1")
        with pytest.raises(BackendError, match="read only") as caught:
            await limiter.try_acquire()
        assert is_open(limiter)
        assert caught.value.outage
        await redis.execute_command("REPLICAOF", "NO", "ONE")
    finally:
        await redis.aclose()


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        (redis_errors.ConnectionError("Connection refused"), True),
        (redis_errors.TimeoutError("Timeout reading from socket"), True),
        (redis_errors.BusyLoadingError("Redis is loading the dataset in memory"), True),
        (redis_errors.ReadOnlyError("You can't write against a read only replica."), True),
        (redis_errors.ResponseError("BUSY Redis is busy running a script."), True),
        (redis_errors.MasterDownError("Link with MASTER is down"), True),
        (redis_errors.ClusterDownError("The cluster is down"), True),
        (redis_errors.TryAgainError("Multiple keys request during rehashing of slot"), True),
        (redis_errors.OutOfMemoryError("command not allowed when used memory > 'maxmemory'"), True),
        (redis_errors.ResponseError("MISCONF Redis is configured to save RDB snapshots"), True),
        (redis_errors.ResponseError("WRONGTYPE Operation against a key holding the wrong"), False),
        (redis_errors.ResponseError("ERR unknown command 'FCALL'"), False),
        (redis_errors.NoPermissionError("this user has no permissions to run 'evalsha'"), False),
    ],
)
def test_the_redis_error_mapper_tells_an_outage_from_a_refusal(
    error: Exception, outage: bool
) -> None:
    assert call_error("the acquire script", error, True).outage is outage


# -- what the backend remembers ------------------------------------------------------------------


@looptime
async def test_an_open_breaker_is_remembered_after_many_other_names() -> None:
    backend = Flaky()
    limiter = RateLimiter("down", backend)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 1000, 1))
    backend.down = True
    with pytest.raises(BackendError, match="unreachable"):
        await limiter.try_acquire()
    del limiter
    others = [RateLimiter(f"other-{i}", backend) for i in range(10_000)]
    limiter = RateLimiter("down", backend)
    with pytest.raises(BackendError, match=FAILS_AT_ONCE):
        await limiter.try_acquire()
    assert backend.reached == 1
    assert len(others) == 10_000


def test_a_backend_keeps_no_breaker_of_an_idle_name() -> None:
    backend = MemoryBackend()
    kept = RateLimiter("kept", backend)
    for i in range(10_000):
        RateLimiter(f"passing-{i}", backend)
    gc.collect()
    remembered = backend.context.breakers._named
    assert len(remembered) <= 3, len(remembered)
    assert RateLimiter("kept", backend).breaker is kept.breaker


@looptime
async def test_a_backend_drops_open_breakers_long_past_their_back_off_when_it_keeps_many(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aiolimit import _breaker

    monkeypatch.setattr(_breaker, "_KEPT_MOST", 3)
    backend = Flaky()
    backend.down = True

    async def fail(name: str) -> None:
        with pytest.raises(BackendError, match="unreachable"):
            await RateLimiter(name, backend).try_acquire()  # (no limiter object is kept)

    for name in ("old-1", "old-2"):
        await fail(name)
    await asyncio.sleep(backend.breaker_policy.max_backoff + 1)  # long past their back-off
    for name in ("new-1", "new-2"):
        await fail(name)
    gc.collect()
    kept = backend.context.breakers._named
    assert sorted(kept) == ["new-1", "new-2"]  # the old ones' next call probes anyway
    assert not aiolimit.breaker_of(backend, "old-1").is_open
    assert aiolimit.breaker_of(backend, "new-1").is_open


# -- the back-offs are the backend's option --------------------------------------------------------


@looptime
async def test_a_backends_breaker_option_sets_the_back_offs_of_its_limiters_and_views() -> None:
    backend = Flaky(breaker=BreakerPolicy(first_backoff=2, max_backoff=3))
    assert backend.breaker_policy == BreakerPolicy(2, 3)
    limiter = RateLimiter("slow-to-retry", backend)
    view = limiter.for_client("client-1")
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 1000, 1))
    backend.down = True
    loop = asyncio.get_running_loop()
    with pytest.raises(BackendError, match="unreachable"):
        await limiter.try_acquire()
    failed_at = loop.time()
    await asyncio.sleep(1.9)
    with pytest.raises(BackendError, match=FAILS_AT_ONCE):
        await view.try_acquire()  # the view's calls share the breaker and its back-off
    assert backend.reached == 1
    await asyncio.sleep(failed_at + 2 - loop.time())
    with pytest.raises(BackendError, match="unreachable"):  # the probe, after 2 s
        await limiter.try_acquire()
    assert backend.reached == 2
    breaker = aiolimit.breaker_of(backend.with_client("client-2"), "slow-to-retry")
    assert breaker is aiolimit.breaker_of(backend, "slow-to-retry")
    assert (breaker.first_backoff, breaker.max_backoff) == (2, 3)
    assert RateLimiter("other", MemoryBackend()).breaker.first_backoff == 0.5  # the default


async def test_a_redis_backends_breaker_option_of_zero_lets_every_call_meet_the_store(
    doomed_server: LocalRedis,
) -> None:
    redis = Redis.from_url(doomed_server.url)
    try:
        backend = RedisBackend(redis, timeout=1, breaker=BreakerPolicy(first_backoff=0))
        limiter = RateLimiter("always-asks", backend)
        await limiter.set_rate(RateLimiterConfig.build(OVERALL, 1000, 1))
        doomed_server.kill()
        for caller in (limiter, limiter.for_client("client-1"), limiter):
            with pytest.raises(BackendError, match="unreachable"):  # never at once
                await caller.try_acquire()
        assert not is_open(limiter)
        assert backend.with_client("client-2").breaker_policy == BreakerPolicy(0, 10)
    finally:
        await redis.aclose()


def test_a_breaker_policy_takes_seconds_and_is_checked() -> None:
    assert BreakerPolicy() == BreakerPolicy(first_backoff=0.5, max_backoff=10.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        BreakerPolicy().first_backoff = 1  # type: ignore[misc]
    for bad in ({"first_backoff": -1}, {"max_backoff": float("nan")}, {"first_backoff": True}):
        with pytest.raises(aiolimit.InvalidArgumentError):
            BreakerPolicy(**bad)  # type: ignore[arg-type]
    with pytest.raises(aiolimit.InvalidArgumentError, match="breaker"):
        MemoryBackend(breaker=0.5)  # type: ignore[arg-type]
