"""A foresight (``Backend.start_foresee``): what an attempt of some permits would get once the
attempts started before it are decided, taking nothing. On Redis it rides in the script call
of the attempt before it: a paced caller's ask carries the next caller's foresight, so the
next caller learns when it may be granted without a call of its own (test_reserve_paced.py
holds the pacing). Every store: memory (virtual time), fakeredis, redis-server and Valkey."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aiolimit import (
    Algorithm,
    InvalidArgumentError,
    NotConfiguredError,
    RateLimiter,
    RateLimiterConfig,
    RateType,
)
from aiolimit.backends import Backend, Grant, Refusal

HOUR = 3600


async def configured(
    backend: Backend, name: str, algorithm: Algorithm, rate_type: RateType
) -> None:
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(rate_type, 10, HOUR, algorithm=algorithm))


def foresight(backend: Backend, name: str, permits: int) -> Any:
    started = backend.start_foresee(name, permits)
    assert started is not None  # (every store of ours foresees)
    return started


@pytest.mark.parametrize("rate_type", list(RateType))
@pytest.mark.parametrize("algorithm", list(Algorithm))
async def test_a_foresight_sees_the_attempt_before_it_and_takes_nothing(
    store: Any, name: str, algorithm: Algorithm, rate_type: RateType
) -> None:
    client_id = "c" if rate_type is RateType.PER_CLIENT else None
    backend = store.backend(client_id)
    await configured(backend, name, algorithm, rate_type)
    assert isinstance(await backend.try_acquire(name, 6), Grant)
    # The attempt for the last 4, and behind it a foresight of 3 more: one call on Redis.
    began = asyncio.get_running_loop().time()
    asking = backend.start_acquire(name, 4, 0)
    seeing = foresight(backend, name, 3)
    granted, seen = await asking, await seeing
    assert isinstance(granted, Grant)
    assert isinstance(seen, Refusal)
    assert seen.left == granted.left == 0  # (it saw the grant before it)
    waits = await backend.wait_time(name, 3)  # (asked after it: as long, less what passed)
    passed = round((asyncio.get_running_loop().time() - began) * 1e6)
    assert 0 < waits <= seen.retry_in <= waits + passed + 1_000  # (+ the clocks' grain)
    assert seen.retry_in <= HOUR * 1_000_000
    # Nothing taken: a foresight of what is free says "now", and leaves it free.
    assert await backend.release(name, 4, granted.member) == 4
    free = await foresight(backend, name, 3)
    assert (free.retry_in, free.left) == (0, 4)
    assert await backend.available_permits(name) == 4
    assert isinstance(await backend.try_acquire(name, 4), Grant)


async def test_a_foresight_is_refused_what_an_attempt_is_refused(store: Any, name: str) -> None:
    backend = store.backend()
    with pytest.raises(NotConfiguredError):
        await foresight(backend, name, 1)
    await configured(backend, name, Algorithm.SLIDING_WINDOW, RateType.OVERALL)
    with pytest.raises(InvalidArgumentError, match="exceed the rate"):
        await foresight(backend, name, 11)
    assert await backend.available_permits(name) == 10


@pytest.mark.parametrize("store", ["redis", "valkey"], indirect=True)
async def test_an_attempt_and_the_foresight_behind_it_are_one_script_call(
    store: Any, name: str
) -> None:
    backend = store.backend()
    await configured(backend, name, Algorithm.SLIDING_WINDOW, RateType.OVERALL)
    redis = store.clients[0]
    before = await script_calls(redis)
    asking, seeing = backend.start_acquire(name, 4, 0), foresight(backend, name, 7)
    assert isinstance(await asking, Grant)
    assert (await seeing).retry_in > 0
    assert await script_calls(redis) - before == 1


async def script_calls(redis: Any) -> int:
    stats = await redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("fcall", "evalsha"))
