"""One rule for rewriting a stored config: what was granted keeps counting, unless the call
says ``keep_state=False`` (every budget then restarts full). ``set_rate``, ``update_rate`` and
``ensure_rate`` follow it alike, on every backend; a change of rate type or algorithm always
starts afresh."""

from __future__ import annotations

import inspect

import pytest

from aiolimit import RateLimiter, RateLimiterConfig, RateType, ShardedRateLimiter

OVERALL = RateType.OVERALL


@pytest.mark.parametrize("limiter_class", [RateLimiter, ShardedRateLimiter])
@pytest.mark.parametrize("method", ["set_rate", "update_rate"])
def test_every_method_that_rewrites_a_config_keeps_the_state_by_default(limiter_class, method):
    parameter = inspect.signature(getattr(limiter_class, method)).parameters["keep_state"]
    assert parameter.default is True


async def _used(store, name) -> RateLimiter:
    limiter = RateLimiter(name, store.backend())
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 2, 100))
    assert await limiter.try_acquire(2)
    return limiter


async def test_set_rate_keeps_what_was_granted(store, name):
    limiter = await _used(store, name)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 3, 100))
    assert await limiter.available_permits() == 1


async def test_update_rate_keeps_what_was_granted(store, name):
    limiter = await _used(store, name)
    assert await limiter.update_rate(RateLimiterConfig.build(OVERALL, 3, 100))
    assert await limiter.available_permits() == 1


async def test_ensure_rate_keeps_what_was_granted(store, name):
    limiter = await _used(store, name)
    assert await limiter.ensure_rate(RateLimiterConfig.build(OVERALL, 3, 100))
    assert await limiter.available_permits() == 1


@pytest.mark.parametrize("method", ["set_rate", "update_rate"])
async def test_keep_state_false_restarts_every_budget_full(store, name, method):
    limiter = await _used(store, name)
    await getattr(limiter, method)(RateLimiterConfig.build(OVERALL, 3, 100), keep_state=False)
    assert await limiter.available_permits() == 3
