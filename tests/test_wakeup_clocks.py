"""A waiter's wake-up maps its limiter's own clock to the loop's: limiters whose clocks differ
(``clock='client'``, where each limiter's clock is the latest time any client sent it; a
cluster's nodes under ``clock='server'``) are each mapped on their own, so a clock that one
skewed host pushed forward does not make waiters on other limiters early.

On every store of the conformance suite: the memory backend under looptime, fakeredis,
redis-server and Valkey on the real clock (a client clock there, ``time.time``).
"""

from __future__ import annotations

import time

import pytest
from conformance import check_after, new_client, now, take

from aiolimit import RateLimiter, RateLimiterConfig, RateType
from aiolimit.backends._clock import REMEMBERED, ClockMaps

SKEW = 5.0  # how far ahead the skewed host's clock runs


@pytest.mark.parametrize("skew", [0.3, SKEW])
async def test_a_clock_one_host_pushed_forward_does_not_wake_another_limiters_waiters_early(
    store, name, skew
):
    # 1 per 0.5 s on two limiters. A host whose clock runs `skew` ahead takes a permit of
    # one: that limiter's clock is ahead from then on, and this process's reservation on it
    # is decided there. One map for both clocks took that offset for the other limiter's
    # too, and its second permit woke `skew` early (at once, for a skew past 0.5 s).
    base = time.time if store.is_redis else now
    ours = new_client(store, clock=base)
    skewed = new_client(store, clock=lambda: base() + skew)
    pushed = RateLimiter(f"{name}-pushed", ours)
    other = RateLimiter(f"{name}-other", ours)
    for limiter in (pushed, other):
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1, 0.5))
    assert await RateLimiter(pushed.name, skewed).try_acquire()
    await pushed.acquire()  # a reservation on the pushed clock, slept out here
    first = await take(other)
    assert first is not None
    await other.acquire()
    check_after(store, first, 0.5, "the other limiter's second permit")


def test_each_clock_has_its_own_map_and_the_maps_are_bounded():
    maps = ClockMaps()
    maps.of("a").observe(105_000_000, 100.0)  # clock a: 5 s ahead of the loop
    maps.of("b").observe(100_200_000, 100.0)  # clock b: 0.2 s
    assert maps.of("a").local(200_000_000) == pytest.approx(195.0)
    assert maps.of("b").local(200_000_000) == pytest.approx(199.8)
    assert maps.of("c").local(200_000_000) is None  # never seen: no offset assumed
    for source in range(REMEMBERED):
        maps.of(source)
    assert len(maps) == REMEMBERED
    assert maps.of("a").local(200_000_000) is None  # the least recently used went first
