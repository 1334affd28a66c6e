"""A refusal says when to come back itself: the decorator and the HTTP clients' guard raise
``RateLimited`` with the refusal's own ``retry_in``, after one attempt (one per shard), with
no second call to ask the wait (which another caller could change meanwhile)."""

from __future__ import annotations

import pytest
from conftest import Store
from counting import count_calls

from aiolimit import RateLimited, RateLimiter, RateLimiterConfig, RateType, ShardedRateLimiter
from aiolimit._calls import CallGuard
from aiolimit.backends.base import Refusal

OVERALL = RateType.OVERALL


def limiter_on(store: Store, name: str, sharded: bool) -> RateLimiter | ShardedRateLimiter:
    backend = store.backend()
    if sharded:
        return ShardedRateLimiter(name, backend, shards=2)
    return RateLimiter(name, backend)


def refusal_seconds(attempts: list[object]) -> float:
    refusals = [a for a in attempts if isinstance(a, Refusal)]
    assert refusals and len(refusals) == len(attempts)
    return min(r.retry_in for r in refusals) / 1e6


@pytest.mark.parametrize("sharded", [False, True], ids=["plain", "sharded"])
async def test_the_decorator_raises_with_the_refusals_retry_in_after_one_attempt(
    store: Store, name: str, sharded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    limiter = limiter_on(store, name, sharded)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 2, 60))

    @limiter.limit(timeout=5)
    async def call() -> str:
        return "called"

    assert [await call(), await call()] == ["called", "called"]
    calls = count_calls(monkeypatch, limiter.backend)
    with pytest.raises(RateLimited) as refused:
        await call()
    assert calls.count["wait_time"] == 0
    assert calls.count["try_acquire"] == (2 if sharded else 1)  # one attempt (per shard)
    assert refused.value.retry_after == refusal_seconds(calls.attempts)
    assert 55 < refused.value.retry_after <= 60
    assert refused.value.name == name


@pytest.mark.parametrize("sharded", [False, True], ids=["plain", "sharded"])
async def test_the_call_guard_raises_with_the_refusals_retry_in_after_one_attempt(
    store: Store, name: str, sharded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    limiter = limiter_on(store, name, sharded)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 2, 60))
    guard = CallGuard(limiter, permits=1, timeout=0, retry=False)
    assert [await limiter.try_acquire(), await limiter.try_acquire()] == [True, True]
    calls = count_calls(monkeypatch, limiter.backend)
    with pytest.raises(RateLimited) as refused:
        await guard.before_call()
    assert calls.count["wait_time"] == 0
    assert calls.count["try_acquire"] == (2 if sharded else 1)
    assert refused.value.retry_after == refusal_seconds(calls.attempts)
    assert refused.value.name == name
