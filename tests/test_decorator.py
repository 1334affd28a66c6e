"""``limiter.limit()``: a decorator that takes permits before each call of an async function."""

from __future__ import annotations

import asyncio

import pytest

from aiolimit import (
    InvalidArgumentError,
    MemoryBackend,
    RateLimited,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    ShardedRateLimiter,
)

pytestmark = pytest.mark.looptime


async def test_each_call_waits_for_its_permits_like_acquire() -> None:
    limiter = RateLimiter("calls", MemoryBackend())
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, 1))
    loop = asyncio.get_running_loop()
    ran: list[tuple[int, float]] = []

    @limiter.limit()
    async def call(n: int) -> int:
        ran.append((n, loop.time()))
        return n * 10

    assert call.__name__ == "call"
    assert await asyncio.gather(*(call(n) for n in range(5))) == [0, 10, 20, 30, 40]
    assert [round(at, 3) for _, at in sorted(ran)] == [0, 0, 1, 1, 2]


async def test_past_the_timeout_a_call_raises_rate_limited_and_does_not_run() -> None:
    limiter = ShardedRateLimiter("heavy", MemoryBackend(), shards=2)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 6, 60))
    ran = []

    @limiter.limit(3, timeout=10)
    async def call() -> None:
        ran.append(True)

    await call()
    await call()
    with pytest.raises(RateLimited) as refused:
        await call()
    assert len(ran) == 2
    assert refused.value.name == "heavy"
    assert refused.value.retry_after == 60


async def test_bad_uses_raise_invalid_argument_error() -> None:
    limiter = RateLimiter("x", MemoryBackend())
    with pytest.raises(InvalidArgumentError):
        limiter.limit(0)
    with pytest.raises(InvalidArgumentError):
        limiter.limit(timeout=-1)
    with pytest.raises(InvalidArgumentError, match="async"):
        limiter.limit()(lambda: None)  # type: ignore[arg-type]


async def test_the_bare_decorator_takes_one_permit_per_call() -> None:
    limiter = RateLimiter("bare", MemoryBackend())
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, 1))
    loop = asyncio.get_running_loop()

    @limiter.limit
    async def call(n: int) -> float:
        return loop.time()

    assert call.__name__ == "call"
    assert [round(at, 3) for at in await asyncio.gather(*(call(n) for n in range(3)))] == [
        0,
        0,
        1,
    ]


def test_rate_limited_says_the_wait_with_three_decimals_always() -> None:
    assert str(RateLimited("api", 1.0)).endswith("retry after 1.000 s")
    assert str(RateLimited("api", 0.9994)).endswith("retry after 0.999 s")
    assert str(RateLimited("api", 12.34567)).endswith("retry after 12.346 s")
