"""Scripts as a Redis Functions library (FCALL) where the server has functions and lets the
client load them; EVALSHA where it does not. Real redis-server 7 and Valkey."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from aiolimit import BackendError, RateLimiter, RateLimiterConfig, RateType, RedisBackend
from aiolimit.backends.redis._functions import LIBRARY_NAME
from tools import LocalRedis

_users = itertools.count()


@pytest.fixture(params=["redis", "valkey"])
def server(request: pytest.FixtureRequest) -> LocalRedis:
    server: LocalRedis = request.getfixturevalue(f"{request.param}_server")
    return server


@pytest.fixture
async def redis(server: LocalRedis) -> AsyncIterator[Redis]:
    client = Redis.from_url(server.url)
    yield client
    await client.aclose()


@pytest.fixture
def prefix() -> str:
    return f"fn{next(_users)}-{os.getpid()}:"


async def script_calls(redis: Redis) -> dict[str, int]:
    stats: dict[str, Any] = await redis.info("commandstats")
    names = ("evalsha", "eval", "fcall")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in names}


def steps(limiter: RateLimiter) -> list[Any]:
    """Every operation once, and what each returns on a fresh limiter."""
    return [
        (lambda: limiter.try_set_rate(RateLimiterConfig.build(RateType.OVERALL, 10, 60)), True),
        (lambda: limiter.try_acquire(2), True),
        (limiter.available_permits, 8),
        (lambda: limiter.release(1), None),
        (lambda: limiter.update_rate(RateLimiterConfig.build(RateType.OVERALL, 8, 60)), True),
        (lambda: limiter.expire(60), True),
        (limiter.clear_expire, True),
        (lambda: limiter.set_rate(RateLimiterConfig.build(RateType.PER_CLIENT, 10, 60)), None),
        (lambda: limiter.try_acquire(3), True),
        (limiter.delete, True),
    ]


async def test_scripts_run_as_functions_where_the_server_has_them(
    redis: Redis, prefix: str
) -> None:
    limiter = RateLimiter("fn", RedisBackend(redis, prefix=prefix))
    before = await script_calls(redis)
    for step, expected in steps(limiter):
        assert await step() == expected
    after = await script_calls(redis)
    assert after["fcall"] - before["fcall"] >= len(steps(limiter))  # (some take two scripts)
    assert after["evalsha"] == before["evalsha"] and after["eval"] == before["eval"]
    libraries = await redis.function_list(library=LIBRARY_NAME)
    assert len(libraries) == 1


async def test_every_operation_recovers_after_function_flush(redis: Redis, prefix: str) -> None:
    limiter = RateLimiter("flushed", RedisBackend(redis, prefix=prefix))
    for step, expected in steps(limiter):
        await redis.function_flush()
        assert await step() == expected


async def test_concurrent_calls_recover_together_after_function_flush(
    redis: Redis, prefix: str
) -> None:
    backend = RedisBackend(redis, prefix=prefix)
    limiter = RateLimiter("flushed-together", backend)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 30, 60))
    await redis.function_flush()
    granted = await asyncio.gather(*(backend.try_acquire("flushed-together", 1) for _ in range(40)))
    assert sum(a.granted for a in granted) == 30


async def test_a_user_who_may_not_load_functions_gets_evalsha_and_survives_script_flush(
    server: LocalRedis, redis: Redis, prefix: str
) -> None:
    user = f"no-functions-{next(_users)}"
    await redis.execute_command(
        "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-function", "-fcall"
    )
    limited = Redis.from_url(server.url, username=user, password="pw")
    try:
        limiter = RateLimiter("evalsha", RedisBackend(limited, prefix=prefix))
        before = await script_calls(redis)
        for step, expected in steps(limiter):
            await redis.script_flush()  # the EVALSHA path loads each script again
            assert await step() == expected
        after = await script_calls(redis)
        assert after["fcall"] == before["fcall"]
        assert after["evalsha"] > before["evalsha"]
    finally:
        await limited.aclose()
        await redis.execute_command("ACL", "DELUSER", user)


async def test_a_functions_error_reads_as_a_scripts_does(redis: Redis, prefix: str) -> None:
    backend = RedisBackend(redis, prefix=prefix)
    limiter = RateLimiter("foreign", backend)
    await redis.set(backend.keys("foreign").config, "not a hash")
    with pytest.raises(BackendError) as raised:
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 60))
    assert (await script_calls(redis))["fcall"] > 0
    message = str(raised.value)
    assert message.startswith("Redis refused the set_rate script: WRONGTYPE"), message
    assert "user_function" not in message and "script:" not in message.split(":", 1)[1], message


async def test_every_number_a_grant_answers_is_its_own_across_the_kept_texts(
    redis: Redis, prefix: str
) -> None:
    # The library keeps the texts of the integers it formats, at most 512 of them, from one
    # FCALL to the next. 1 500 grants at as many distinct times (client clock), each taking
    # 1 to 3 permits (so the permits left differ too): the cache is filled and emptied
    # several times over, and every grant's start and permits left are still its own.
    now = [1_700_000_000.0]
    backend = RedisBackend(redis, prefix=prefix, clock=lambda: now[0])
    limiter = RateLimiter("texts", backend)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 10**9, 3600))
    before = await script_calls(redis)
    left = 10**9
    for k in range(1500):
        now[0] += 0.000_007 * (k % 11 + 1)  # distinct, increasing, whole microseconds
        permits = k % 3 + 1
        grant = await backend.try_acquire("texts", permits)
        left -= permits
        assert grant.granted and grant.starts_in == 0
        assert grant.starts_at == round(now[0] * 1_000_000), k
        assert grant.left == left, k
    assert (await script_calls(redis))["fcall"] >= before["fcall"] + 1500


async def test_limiters_of_many_rates_each_keep_their_own_across_calls(
    redis: Redis, prefix: str
) -> None:
    # The library keeps each stored rate's parsed form from one FCALL to the next, at most a
    # few hundred of them: 600 limiters of 600 rates (the cache filled and emptied twice),
    # then each again, and one changed; every limiter answers by its own rate throughout.
    backend = RedisBackend(redis, prefix=prefix)
    before = await script_calls(redis)
    limiters = [RateLimiter(f"rates-{rate}", backend) for rate in range(1, 601)]
    for rate, limiter in enumerate(limiters, 1):
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, rate, 3600))
    for taken in range(2):
        left = await asyncio.gather(*(limiter.available_permits() for limiter in limiters))
        assert left == [max(rate - taken, 0) for rate in range(1, 601)]
        took = await asyncio.gather(*(limiter.try_acquire(1) for limiter in limiters))
        assert took == [rate > taken for rate in range(1, 601)]
    await limiters[0].set_rate(RateLimiterConfig.build(RateType.OVERALL, 3, 3600), keep_state=True)
    assert await limiters[0].try_acquire(2) and not await limiters[0].try_acquire(1)
    assert await limiters[599].try_acquire(598) and not await limiters[599].try_acquire(1)
    assert not await limiters[1].try_acquire(1)  # 2 per hour, taken
    assert (await script_calls(redis))["fcall"] > before["fcall"] + 1200  # through the library
