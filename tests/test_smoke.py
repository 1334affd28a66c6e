from aiolimit import RateLimiter, RateLimiterConfig, RateType


async def test_grants_up_to_the_rate_then_refuses(store, name):
    limiter = RateLimiter(name, store.backend())
    assert await limiter.try_set_rate(RateLimiterConfig.build(RateType.OVERALL, 3, 10))
    assert [await limiter.try_acquire() for _ in range(4)] == [True, True, True, False]
