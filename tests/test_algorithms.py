"""Several rates on one limiter, a minimum spacing, and the three algorithms, on
every backend of the conformance suite: memory (virtual time: exact), fakeredis, a real
redis-server and a real Valkey (real time: short intervals, the suite's tolerances).

Fixed windows are aligned to the limiter's clock: the server's TIME on Redis (this host's wall
clock), the event loop's on the memory backend. Tests that depend on where a window starts
first wait for the start of one (``window_start``), or make sure the current one is far from
its end (``early_in_window``).
"""

from __future__ import annotations

import asyncio
import math
import time
from datetime import timedelta

import pytest
from cluster_keys import masters_holding
from conformance import (
    assert_stored_keys,
    manual_clock,
    new_client,
    now,
    take,
    tolerance,
    until,
    when_free,
)
from redis.asyncio import RedisCluster

from aiolimit import (
    Algorithm,
    InvalidArgumentError,
    Rate,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
    ShardedRateLimiter,
)
from aiolimit.backends import Grant, Refusal
from aiolimit.backends.redis._compat import slot
from tools.cluster import Cluster

pytest_plugins = ["cluster_fixtures"]

OVERALL = RateType.OVERALL
PER_CLIENT = RateType.PER_CLIENT
SLIDING = Algorithm.SLIDING_WINDOW
BUCKET = Algorithm.TOKEN_BUCKET
FIXED = Algorithm.FIXED_WINDOW
ALGORITHMS = pytest.mark.parametrize("algorithm", list(Algorithm), ids=lambda a: a.name.lower())


# -- helpers ------------------------------------------------------------------------------------


def limiter_clock(store) -> float:
    """The limiter's clock, in seconds: the server's TIME (this host's wall clock) on Redis,
    the event loop's on the memory backend."""
    return time.time() if store.is_redis else now()


def _margin(store) -> float:
    """How far past a window's start ``window_start`` returns: a few ms on a real clock, so
    the server's next reading is surely in the new window; nearly none in virtual time."""
    return 0.003 if store.is_redis else 1e-5


async def window_start(store, interval: float) -> float:
    """Sleeps until the next fixed window of ``interval`` starts on the limiter's clock;
    returns that instant on the event loop's clock."""
    clock_us, interval_us = round(limiter_clock(store) * 1e6), round(interval * 1e6)
    wait = ((clock_us // interval_us + 1) * interval_us - clock_us) / 1e6
    start = now() + wait
    await asyncio.sleep(wait + _margin(store))
    return start


async def early_in_window(store, interval: float, needed: float) -> None:
    """Makes sure at least ``needed`` seconds are left in the current fixed window of
    ``interval``: if fewer are, sleeps until the next one starts."""
    clock_us, interval_us = round(limiter_clock(store) * 1e6), round(interval * 1e6)
    left = ((clock_us // interval_us + 1) * interval_us - clock_us) / 1e6
    if left < needed:
        await asyncio.sleep(left + _margin(store))


async def configured(store, name, rates, algorithm=SLIDING, rate_type=OVERALL, **options):
    limiter = RateLimiter(name, store.backend())
    await limiter.set_rate(
        RateLimiterConfig.build(rate_type, rates, algorithm=algorithm, **options)
    )
    return limiter


async def snapshot(store, name: str) -> object:
    """What the store holds for the limiter, TTLs aside, and but for the sliding window's walk
    cursor (a cache of where the last wait computation stopped, which a refusal may move)."""
    backend = store.backend()
    if isinstance(backend, RedisBackend):
        state = {}
        for key in sorted(await backend.redis.keys("*")):
            kind = (await backend.redis.type(key)).decode()
            if kind == "zset":
                state[key] = await backend.redis.zrange(key, 0, -1, withscores=True)
            elif kind == "hash":
                state[key] = await backend.redis.hgetall(key)
            else:
                value = (await backend.redis.get(key)).decode()
                config = await backend.get_config(name)
                sliding = config is not None and config.algorithm is SLIDING
                state[key] = value.split(" ")[:3] if sliding else value
        return state
    limiter = backend._shared.limiters.get(name)
    if limiter is None:
        return None
    budgets = {**limiter.budgets, **limiter.extra}
    stored = limiter.config
    return (
        None
        if stored is None
        else (
            stored.config,
            stored.expires_at,
            stored.deadline,
            None if stored.state is None else (stored.state.last, stored.state.n),
        ),
        {k: (b.used, b.seq, b.live(), b.last, b.n) for k, b in budgets.items()},
        limiter.registry,
    )


def check_at(store, span: tuple[float, float], offset: float, what: str) -> None:
    """Now is ``offset`` after a grant made within ``span`` (to the suite's tolerances)."""
    at = now()
    tolerance(store).check_span((at, at), (span[0] + offset, span[1] + offset), what)


# -- exact waits --------------------------------------------------------------------------------

# Rates 2 per 0.1 s and 4 per 0.4 s; 2 permits taken at 0, then 1 at a time as soon as given:
# when each grant starts. Sliding: 0.1 frees rate 1 twice, then rate 2 holds 4 until the
# 2-permit grant leaves it at 0.4, then 0.5 (both rates' next free permit). Token bucket: rate
# 1 refills a token per 0.05 s, rate 2 per 0.1 s; rate 2's debt catches up at 0.3. Fixed
# windows (from the start of a 0.4 s window): the 0.1 window holds two, the 0.2 one would put
# a fifth in the 0.4 s window, so it waits for the next: 0.4, then 0.5.
SCHEDULES = {
    SLIDING: [0.1, 0.1, 0.4, 0.4, 0.5],
    BUCKET: [0.05, 0.1, 0.15, 0.2, 0.3],
    FIXED: [0.1, 0.1, 0.4, 0.4, 0.5],
}


@pytest.mark.slow
@ALGORITHMS
async def test_each_grant_waits_exactly_until_every_rate_allows_it(store, name, algorithm):
    limiter = await configured(store, name, [Rate(2, 0.1), Rate(4, 0.4)], algorithm)
    if algorithm is FIXED:
        start = await window_start(store, 0.4)
        first = await take(limiter, 2)
        assert first is not None
        first = (start, start)  # grants start at window starts: measured from this one
    else:
        first = await take(limiter, 2)
        assert first is not None
    for i, offset in enumerate(SCHEDULES[algorithm]):
        assert await limiter.try_acquire(timeout=None)
        check_at(store, first, offset, f"grant {i + 2}")


@ALGORITHMS
async def test_a_timeout_shorter_than_the_wait_fails_at_once_and_takes_nothing(
    store, name, algorithm
):
    # The limiter's clock stands still (at a whole hour: early in a 100 s window), so what the
    # refusals leave is exact; the event loop's clock shows they did not wait.
    _, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(
        RateLimiterConfig.build(OVERALL, [Rate(2, 100), Rate(3, 3600)], algorithm=algorithm)
    )
    assert await limiter.try_acquire(2)
    before, waited = await snapshot(store, name), await limiter.wait_time(2)
    start = now()
    assert not await limiter.try_acquire(timeout=1)
    assert not await limiter.try_acquire(2, timeout=timedelta(seconds=1.5))
    assert not await limiter.try_acquire()
    tolerance(store).check(now(), start, "the refusals (a timeout that cannot be met, slept out)")
    assert await snapshot(store, name) == before, "a refusal wrote something"
    assert await limiter.available_permits() == 0
    assert await limiter.wait_time(2) == waited


@ALGORITHMS
async def test_min_spacing_keeps_the_starts_of_consecutive_grants_apart(store, name, algorithm):
    # One grant may carry several permits: the spacing is between starts.
    limiter = await configured(store, name, [Rate(12, 1)], algorithm, min_spacing=0.1)
    first = await take(limiter, 3)
    assert first is not None
    assert not await limiter.try_acquire(), "granted inside the spacing"
    done: list[float] = []

    async def waiter() -> None:
        assert await limiter.try_acquire(2, timeout=None)
        done.append(now())

    tasks = []
    for _ in range(3):
        tasks.append(asyncio.create_task(waiter()))
        await asyncio.sleep(0.01)  # arrive in this order
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    tol = tolerance(store)
    for i, at in enumerate(sorted(done)):
        due = 0.1 * (i + 1)
        tol.check_span((at, at), (first[0] + due, first[1] + due), f"waiter {i + 1}")


# Rates 2 per 30 s and 4 per 1000 s, spacing 5 s; 2 permits at 0. When the third one is
# granted: sliding, when the first grant leaves the 30 s window; token bucket, when a token of
# rate 1 has come back (15 s); fixed windows, when the next 30 s window starts. And the
# fourth: the spacing after the third (token bucket: rate 1's next token, at 30 s).
AFTER_REFUSALS = {SLIDING: (30, 35), BUCKET: (15, 30), FIXED: (30, 35)}


@ALGORITHMS
async def test_refused_attempts_leave_no_trace_in_any_rate_or_the_spacing(store, name, algorithm):
    # The seed's rolling limiter recorded refused attempts, so a caller over the limit who kept
    # trying stayed blocked. Here each grant comes exactly when it would without them. The
    # limiter's clock moves only when the test moves it (it starts at a whole hour: the start
    # of a 30 s and of a 1000 s window), so every refusal is made while the limit is full; the
    # intervals are long, so that Redis keeps the keys (their TTLs run on its own clock).
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    rates = [Rate(2, 30), Rate(4, 1000)]
    await limiter.set_rate(
        RateLimiterConfig.build(OVERALL, rates, algorithm=algorithm, min_spacing=5)
    )
    first = round(clock() * 1e6)
    assert await limiter.try_acquire(2)
    for i, offset in enumerate(AFTER_REFUSALS[algorithm]):
        # (The first may drop grants that have left a sliding window from its log.)
        assert not await limiter.try_acquire()
        before = await snapshot(store, name)
        for _ in range(5):
            assert not await limiter.try_acquire()
            assert not await limiter.try_acquire(timeout=1)
        assert await snapshot(store, name) == before, "a refusal wrote something"
        grant = await backend.try_acquire(name, 1, None)  # the next slot, reserved
        assert isinstance(grant, Grant)
        assert grant.starts_at == first + offset * 1_000_000, f"grant {i + 3}"
        clock.advance(grant.starts_in / 1e6)  # to its start


# Rate 4 per 40 s; a 1-permit request every 5 s from 0, a 4-permit one at 12.5 s. When the
# big one starts: sliding, once the grants of 0, 5 and 10 have left the window (50); token
# bucket, once 4 tokens are back (30); fixed windows, at the next window (40).
BIG_STARTS = {SLIDING: 50, BUCKET: 30, FIXED: 40}


@ALGORITHMS
async def test_a_big_request_amid_small_ones_is_served_first_come_first_served(
    store, name, algorithm
):
    # Each request reserves its slot as it arrives (what try_acquire then sleeps out), on a
    # clock the test moves: it starts at a whole hour (a window's start), and the intervals
    # are long, so that Redis keeps the keys on its own clock.
    clock, backend = manual_clock(store)
    await RateLimiter(name, backend).set_rate(
        RateLimiterConfig.build(OVERALL, [Rate(4, 40)], algorithm=algorithm)
    )
    origin, arrived = round(clock() * 1e6), 0.0
    starts: list[float] = []
    for at, permits in [(0, 1), (5, 1), (10, 1), (12.5, 4), (15, 1), (20, 1), (25, 1)]:
        clock.advance(at - arrived)
        arrived = at
        grant = await backend.try_acquire(name, permits, None)
        assert isinstance(grant, Grant)
        starts.append((grant.starts_at - origin) / 1e6)
    assert starts[:3] == [0, 5, 10]  # at once
    assert starts[3] == BIG_STARTS[algorithm], "the big request"
    assert min(starts[4:]) >= starts[3], "a request that came after the big one went before it"


# -- release and cancellation -------------------------------------------------------------------


@ALGORITHMS
async def test_release_hands_permits_back_to_every_rate_never_above_the_smallest(
    store, name, algorithm
):
    await early_in_window(store, 100, 2)  # (a 100 s window ends where a 3600 s one may)
    limiter = await configured(store, name, [Rate(4, 100), Rate(6, 3600)], algorithm)
    await limiter.release(1)  # nothing granted yet
    assert await limiter.available_permits() == 4
    assert await limiter.try_acquire(4)
    assert await limiter.available_permits() == 0
    await limiter.release(2)
    assert await limiter.available_permits() == 2
    await limiter.release(6)
    assert await limiter.available_permits() == 4
    # Rate 2 (6 permits) gets them back too, else it would be full at the second round.
    for _ in range(3):
        assert await limiter.try_acquire(4)
        await limiter.release(4)
    assert [await limiter.try_acquire() for _ in range(5)] == [True] * 4 + [False]


async def test_a_fixed_window_releases_nothing_while_a_later_window_is_reserved(store, name):
    await early_in_window(store, 100, 2)
    limiter = await configured(store, name, [Rate(2, 100)], FIXED)
    backend = limiter.backend
    assert await limiter.try_acquire(2)
    reserved = await backend.try_acquire(name, 1, None)  # a waiter, in the next window
    assert isinstance(reserved, Grant) and reserved.starts_in > 0
    assert reserved.starts_at % 100_000_000 == 0, "not at a window's start"
    assert await backend.release(name, 1) == 0
    assert await limiter.available_permits() == 0
    # A waiter's own grant (a cancelled caller's hand-back) can go: the next request is
    # reserved in that window again. The current window's count is no longer kept (only the
    # latest window's is): nothing more comes back, and nothing is granted in it.
    assert await backend.release(name, 1, reserved.member) == 1
    again = await backend.try_acquire(name, 2, None)
    assert isinstance(again, Grant) and again.starts_at == reserved.starts_at
    assert await backend.release(name, 2, again.member) == 2
    assert await backend.release(name, 2) == 0
    assert await limiter.available_permits() == 0
    assert not await limiter.try_acquire()


@ALGORITHMS
async def test_a_cancelled_waiter_hands_its_reservation_back(store, name, algorithm):
    # The limiter's clock stays put (it starts at a whole hour: early in a 100 s window), so
    # the wait another client sees changes only by what the waiter reserves and hands back.
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(
        RateLimiterConfig.build(OVERALL, [Rate(2, 100), Rate(4, 3600)], algorithm=algorithm)
    )
    other = RateLimiter(name, new_client(store, clock=clock))
    assert await limiter.try_acquire(2)
    waited = await other.wait_time(2)
    waiter = asyncio.create_task(limiter.acquire(2))
    await until(lambda: other.wait_time(2), lambda wait: wait != waited, "the reservation")
    assert await other.wait_time(2) > waited + 1, "the waiter reserved too little"
    assert not waiter.done()  # sleeping until its start
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    await until(lambda: other.wait_time(2), lambda wait: wait == waited, "the hand-back")


# -- rate types, algorithm changes, config --------------------------------------------------------


@pytest.mark.slow
@ALGORITHMS
async def test_per_client_limiters_give_each_client_all_of_its_rates(store, name, algorithm):
    a = RateLimiter(name, new_client(store, "a"))
    b = RateLimiter(name, new_client(store, "b"))
    await early_in_window(store, 100, 2)
    await a.set_rate(
        RateLimiterConfig.build(PER_CLIENT, [Rate(2, 0.2), Rate(3, 100)], algorithm=algorithm)
    )
    for limiter in (a, b):
        if algorithm is FIXED:
            await window_start(store, 0.2)
        assert await limiter.try_acquire(2)
        assert not await limiter.try_acquire()
        assert await limiter.try_acquire(timeout=0.3)  # rate 1 frees a permit within 0.2 s
        assert await limiter.available_permits() == 0
        assert not await limiter.try_acquire(timeout=0.3), "rate 2 (3 per 100 s) not applied"
    assert await b.available_permits() == 0
    assert await a.available_permits() == 0
    assert await RateLimiter(name, new_client(store, "c")).available_permits() == 2


@pytest.mark.parametrize(
    ("old", "new"),
    [(a, b) for a in Algorithm for b in Algorithm if a is not b],
    ids=lambda a: a.name.lower(),
)
async def test_a_change_of_algorithm_clears_the_state_even_with_keep_state(store, name, old, new):
    await early_in_window(store, 100, 2)
    rates = [Rate(4, 100), Rate(5, 3600)]
    limiter = await configured(store, name, rates, old)
    assert await limiter.try_acquire(4)
    assert await limiter.update_rate(
        RateLimiterConfig.build(OVERALL, rates, algorithm=new), keep_state=True
    )
    assert (await limiter.get_config()).algorithm is new
    assert await limiter.available_permits() == 4
    assert await limiter.try_acquire(1)
    # Only the new algorithm's keys are left: a sliding window's value key and permits ZSET per
    # rate besides the config; the counters' state lives in the config hash.
    await assert_stored_keys(store, 5 if new is SLIDING else 1)
    await limiter.set_rate(
        RateLimiterConfig.build(OVERALL, rates, algorithm=new), keep_state=True
    )  # same: kept
    assert await limiter.available_permits() == 3
    await limiter.set_rate(
        RateLimiterConfig.build(OVERALL, rates, algorithm=new), keep_state=False
    )  # cleared
    assert await limiter.available_permits() == 4


@pytest.mark.parametrize(
    ("arguments", "options", "expected"),
    [
        (
            ([Rate(3, 1), Rate(20, 60)],),
            {"algorithm": BUCKET, "min_spacing": 0.2},
            RateLimiterConfig(
                OVERALL, 3, timedelta(seconds=1), None,
                (Rate(3, 1), Rate(20, 60)), BUCKET, timedelta(milliseconds=200),
            ),
        ),
        (
            (Rate.parse("5/10 seconds; 100/hour"),),
            {"algorithm": "FIXED_WINDOW", "keep_alive": 7200},
            RateLimiterConfig(
                OVERALL, 5, timedelta(seconds=10), timedelta(hours=2),
                (Rate(5, 10), Rate(100, 3600)), FIXED, None,
            ),
        ),
        (
            (7, timedelta(minutes=2)),
            {"min_spacing": timedelta(microseconds=1500)},
            RateLimiterConfig(
                OVERALL, 7, timedelta(minutes=2), None,
                (Rate(7, 120),), SLIDING, timedelta(microseconds=1500),
            ),
        ),
        (
            ([Rate(1, 0.5), Rate(2, 1), Rate(30, 86_400)],),
            {"min_spacing": 0},
            RateLimiterConfig(
                OVERALL, 1, timedelta(milliseconds=500), None,
                (Rate(1, 0.5), Rate(2, 1), Rate(30, 86_400)), SLIDING, None,
            ),
        ),
    ],
)  # fmt: skip
async def test_get_config_round_trips_rates_algorithm_and_spacing(
    store, name, arguments, options, expected
):
    limiter = RateLimiter(name, store.backend())
    assert await limiter.try_set_rate(RateLimiterConfig.build(OVERALL, *arguments, **options))
    config = await limiter.get_config()
    assert config == expected
    assert (config.rate, config.interval) == (expected.rates[0].permits, expected.rates[0].interval)
    assert type(config.algorithm) is Algorithm
    assert await RateLimiter(name, new_client(store)).get_config() == expected


BAD_SETTINGS = [
    ((OVERALL, []), {}),
    ((OVERALL, ()), {}),
    ((OVERALL, [Rate(3, 1)], 1), {}),
    ((OVERALL, [Rate(3, 1), Rate(5, 60)], 60), {}),
    ((OVERALL, [Rate(3, 1), 5]), {}),
    ((OVERALL, 3, 1), {"algorithm": "LEAKY_BUCKET"}),
    ((OVERALL, 3, 1), {"algorithm": "sliding window"}),  # (any case, but a word apart)
    ((OVERALL, 3, 1), {"algorithm": None}),
    ((OVERALL, 3, 1), {"min_spacing": -0.1}),
    ((OVERALL, 3, 1), {"min_spacing": timedelta(seconds=-1)}),
    ((OVERALL, 3, 1), {"min_spacing": math.nan}),
    ((OVERALL, 3, 1), {"min_spacing": math.inf}),
    ((OVERALL, 3, 1), {"min_spacing": "0.2"}),
    ((OVERALL, "3/second; 20/fortnight"), {}),
]


@pytest.mark.filterwarnings("ignore:.*rate_type, rate:DeprecationWarning")  # still checked
async def test_bad_rates_algorithms_and_spacings_raise_and_write_nothing(store, name):
    limiter = RateLimiter(name, store.backend())
    for setter in (limiter.try_set_rate, limiter.set_rate, limiter.update_rate):
        for arguments, options in BAD_SETTINGS:
            with pytest.raises(InvalidArgumentError):
                await setter(*arguments, **options)
    assert await limiter.get_config() is None
    await assert_stored_keys(store, 0)
    # Nor do they touch a stored config.
    await limiter.set_rate(
        RateLimiterConfig.build(OVERALL, [Rate(4, 10), Rate(5, 60)], algorithm=BUCKET)
    )
    stored = await limiter.get_config()
    assert await limiter.try_acquire(2)
    for setter in (limiter.set_rate, limiter.update_rate):
        for arguments, options in BAD_SETTINGS:
            with pytest.raises(InvalidArgumentError):
                await setter(*arguments, **options)
    assert await limiter.get_config() == stored
    assert await limiter.available_permits() == 2


@ALGORITHMS
async def test_permits_over_the_smallest_rate_raise_and_take_nothing(store, name, algorithm):
    limiter = await configured(store, name, [Rate(5, 100), Rate(2, 3600)], algorithm)
    for call in (
        lambda: limiter.try_acquire(3),
        lambda: limiter.try_acquire(3, timeout=1),
        lambda: limiter.acquire(3),
        lambda: limiter.wait_time(3),
    ):
        with pytest.raises(InvalidArgumentError, match="exceed"):
            await call()
    assert await limiter.available_permits() == 2
    assert await limiter.try_acquire(2)


# -- available permits and wait times -------------------------------------------------------------


async def test_a_token_bucket_counts_whole_tokens_and_waits_for_the_refill(store, name):
    # On a clock the test moves: waits are exact (long intervals, so that Redis keeps the keys
    # on its own clock).
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(
        RateLimiterConfig.build(OVERALL, [Rate(4, 40)], algorithm=BUCKET)
    )  # a token per 10 s
    assert await limiter.available_permits() == 4  # starts full
    assert await limiter.try_acquire(4)
    assert await limiter.available_permits() == 0
    assert await limiter.wait_time(1) == 10, "one token"
    assert await limiter.wait_time(4) == 40, "a full bucket"
    clock.advance(25)
    assert await limiter.available_permits() == 2  # 2.5 tokens
    assert await limiter.wait_time(3) == 5, "three tokens"
    assert await limiter.try_acquire(2)
    assert not await limiter.try_acquire()


@pytest.mark.slow
async def test_a_fixed_window_counts_the_room_left_in_the_current_window(store, name):
    # Windows of 1 s: the eight calls before the first sleep fit in one window even where a
    # script call takes tens of ms (fakeredis on a loaded machine).
    limiter = await configured(store, name, [Rate(3, 1.0)], FIXED)
    start = await window_start(store, 1.0)
    assert await limiter.try_acquire(2)
    assert await limiter.available_permits() == 1
    assert await limiter.try_acquire()
    assert await limiter.available_permits() == 0
    tol = tolerance(store)
    tol.check_span(await when_free(limiter, 1), (start + 1.0, start + 1.0), "the next window")
    tol.check_span(
        await when_free(limiter, 3), (start + 1.0, start + 1.0), "the next window, all of it"
    )
    grant = await limiter.backend.try_acquire(name, 3, None)  # reserves the next window
    assert isinstance(grant, Grant) and grant.starts_at % 1_000_000 == 0
    tol.check_span(await when_free(limiter, 1), (start + 2.0, start + 2.0), "the window after")
    await asyncio.sleep(start + 1.0 + 0.02 - now())
    assert await limiter.available_permits() == 0  # the reservation fills it
    await asyncio.sleep(start + 2.0 + 0.02 - now())
    assert await limiter.available_permits() == 3


async def test_a_sliding_window_with_several_rates_reports_the_tightest(store, name):
    # On a clock the test moves: waits are exact (long intervals, so that Redis keeps the keys
    # on its own clock).
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, [Rate(2, 20), Rate(3, 50)]))
    assert await limiter.try_acquire(2)
    assert await limiter.available_permits() == 0
    assert await limiter.wait_time(1) == 20, "rate 1's permit"
    assert await limiter.wait_time(2) == 50, "rate 2's two permits"
    clock.advance(22)
    assert await limiter.available_permits() == 1  # rate 1 has 2, rate 2 has 1
    refusal = await backend.try_acquire(name, 2)
    assert isinstance(refusal, Refusal)
    assert refusal.retry_in == 28_000_000, "the refusal's retry"


@ALGORITHMS
async def test_no_permit_is_available_while_the_spacing_holds_the_next_grant(
    store, name, algorithm
):
    limiter = await configured(store, name, [Rate(10, 60)], algorithm, min_spacing=0.2)
    assert await limiter.available_permits() == 10
    first = await take(limiter)
    assert first is not None
    assert await limiter.available_permits() == 0
    tolerance(store).check_span(
        await when_free(limiter, 1), (first[0] + 0.2, first[1] + 0.2), "the spacing"
    )
    await asyncio.sleep(first[1] + 0.2 + 0.01 - now())
    assert await limiter.available_permits() in (9, 10)  # (9: a fixed window may have ended)
    assert await limiter.try_acquire()


# -- what the first version got wrong ------------------------------------------------------------


async def test_a_full_token_bucket_grants_all_its_tokens_one_at_a_time_at_once(store, name):
    # 3 tokens per second: each token's refill is 333 333.33 us. Charged rounded up on its own,
    # three single grants cost 2 us more than the whole bucket, and the third was refused at
    # the same instant; the remainder is now kept exactly. A client clock stands still.
    limiter = RateLimiter(name, new_client(store, clock=lambda: 1000.0))
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, [Rate(3, 1)], algorithm=BUCKET))
    assert await limiter.try_acquire()
    assert await limiter.available_permits() == 2
    assert [await limiter.try_acquire() for _ in range(3)] == [True, True, False]


async def test_keep_state_with_a_longer_fixed_window_waits_at_most_that_window(store, name):
    # At t = 1000 s, one grant in the 10 s window 100; then the window becomes 25 s with
    # keep_state. A stored window number (100) would be read as the 25 s window 100, 1500 s
    # ahead; the window's end (1010 s) says which 25 s window holds it (the current one).
    limiter = RateLimiter(name, new_client(store, clock=lambda: 1000.0))
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, [Rate(3, 10)], algorithm=FIXED))
    assert await limiter.try_acquire()
    await limiter.set_rate(
        RateLimiterConfig.build(OVERALL, [Rate(3, 25)], algorithm=FIXED), keep_state=True
    )
    assert await limiter.wait_time(1) <= 25


@pytest.mark.parametrize("algorithm", [BUCKET, FIXED], ids=lambda a: a.name.lower())
async def test_keep_state_with_one_more_rate_keeps_counting_the_grants(store, name, algorithm):
    # With one more rate the counters' value key holds fewer numbers than the config has
    # rates: each rate keeps its state by position (the one added starts afresh), so the 3
    # permits just taken still count.
    limiter = RateLimiter(name, new_client(store, clock=lambda: 1000.0))
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, [Rate(3, 10)], algorithm=algorithm))
    assert await limiter.try_acquire(3)
    more = [Rate(3, 10), Rate(100, 3600)]
    await limiter.set_rate(
        RateLimiterConfig.build(OVERALL, more, algorithm=algorithm), keep_state=True
    )
    assert await limiter.available_permits() == 0
    assert not await limiter.try_acquire()


# -- sharding -----------------------------------------------------------------------------------


@ALGORITHMS
async def test_a_sharded_limiter_gives_each_shard_its_share_of_every_rate(store, name, algorithm):
    # The limiter's clock moves 2 ms a grant (from a whole hour: early in a window).
    clock, backend = manual_clock(store)
    limiter = ShardedRateLimiter(name, backend, shards=2)
    await limiter.set_rate(
        RateLimiterConfig.build(OVERALL, [Rate(5, 100), Rate(7, 3600)], algorithm=algorithm)
    )
    shares = [await shard.get_config() for shard in limiter.shards]
    assert [c.rates for c in shares] == [
        (Rate(3, 100), Rate(4, 3600)),
        (Rate(2, 100), Rate(3, 3600)),
    ]
    assert all(c.algorithm is algorithm for c in shares)
    assert all(c.min_spacing is None for c in shares)
    config = await limiter.get_config()
    assert config.rates == (Rate(5, 100), Rate(7, 3600))
    assert config.min_spacing is None
    granted = []
    for _ in range(6):
        granted.append(await limiter.try_acquire())
        clock.advance(0.002)
    assert granted == [True] * 5 + [False]
    assert [await shard.available_permits() for shard in limiter.shards] == [0, 0]
    with pytest.raises(InvalidArgumentError):
        await limiter.try_acquire(4)  # more than either shard's smallest share


# -- Redis key layout and Cluster -------------------------------------------------------------


@pytest.mark.parametrize("store", ["fakeredis", "redis", "valkey"], indirect=True)
async def test_every_key_of_several_sliding_rates_stays_in_the_limiters_slot(store, name):
    hostile = f"{{{name}}}:value2"
    rates = [Rate(2, 10), Rate(3, 60), Rate(4, 3600)]
    a = RateLimiter(hostile, new_client(store, "a"))
    b = RateLimiter(hostile, new_client(store, "b:{x}"))
    await a.set_rate(RateLimiterConfig.build(PER_CLIENT, rates))
    assert await a.try_acquire(2)
    assert await b.try_acquire(1)
    overall = RateLimiter(f"{name}-overall", store.backend())
    await overall.set_rate(RateLimiterConfig.build(OVERALL, rates))
    assert await overall.try_acquire()
    backend = store.backend()
    assert isinstance(backend, RedisBackend)
    for limiter, count in ((a, 2 + 2 * 3 * 2), (overall, 1 + 2 * 3)):
        tag = backend.keys(limiter.name).tag
        keys = [k.decode() for k in await backend.redis.keys("*") if k.decode().startswith(tag)]
        assert len(keys) == count, keys
        assert len({slot(key) for key in keys}) == 1, keys
    await assert_stored_keys(store, 2 + 2 * 3 * 2 + 1 + 2 * 3)
    assert await a.delete()
    assert await overall.delete()
    await assert_stored_keys(store, 0)


COUNTERS = pytest.mark.parametrize("algorithm", [BUCKET, FIXED], ids=lambda a: a.name.lower())


async def config_fields(store, name: str) -> dict[str, str]:
    backend = store.backend()
    assert isinstance(backend, RedisBackend)
    fields = await backend.redis.hgetall(backend.keys(name).config)
    return {k.decode(): v.decode() for k, v in fields.items()}


@COUNTERS
@pytest.mark.parametrize("store", ["fakeredis", "redis", "valkey"], indirect=True)
async def test_an_overall_counter_keeps_its_state_in_the_config_hash(store, name, algorithm):
    await early_in_window(store, 3600, 2)
    limiter = await configured(store, name, [Rate(5, 3600)], algorithm)
    assert await limiter.try_acquire(2)
    assert await limiter.try_acquire(1)
    await assert_stored_keys(store, 1)  # the config alone: no value key
    fields = await config_fields(store, name)
    assert "gen" in fields  # (the life of its state, which each grant's member names)
    last, *numbers = fields["state"].split(" ")
    assert last == "-" and len(numbers) == 2  # "<last> <tat> <frac>", "<last> <end> <count>"
    if algorithm is FIXED:
        assert numbers[1] == "3"
    assert await limiter.available_permits() == 2
    # PER_CLIENT counters keep a value key per client, as before.
    per_client = await configured(store, f"{name}-pc", [Rate(5, 3600)], algorithm, PER_CLIENT)
    assert await per_client.try_acquire()
    await assert_stored_keys(store, 1 + 3)  # its config, registry and the client's value key
    assert "state" not in await config_fields(store, per_client.name)
    assert await limiter.delete()
    assert await per_client.delete()
    await assert_stored_keys(store, 0)


@COUNTERS
@pytest.mark.parametrize("store", ["redis"], indirect=True)
async def test_an_overall_counter_takes_at_most_216_bytes_of_redis_memory(store, algorithm):
    # The size of a counter's state, as benchmarks/memory.py measures it: a name of 18
    # characters, a rate of 100 000 per hour, every permit of it taken.
    name = f"mem-{algorithm.value}-1"
    assert len(name) == 18
    await early_in_window(store, 3600, 2)
    limiter = await configured(store, name, [Rate(100_000, 3600)], algorithm)
    started = now()
    for _ in range(100):
        assert await limiter.try_acquire(1000)
    # Every permit taken. The server's clock runs on meanwhile: a token bucket gives one back
    # every 36 ms of it (the windows, none within the hour, or before the window ends).
    available = await limiter.available_permits()
    back = math.floor((now() - started) * 100_000 / 3600) if algorithm is BUCKET else 0
    assert available <= back, f"{available} permits available, at most {back} came back"
    backend = store.backend()
    assert isinstance(backend, RedisBackend)
    keys = await backend.redis.keys("*")
    assert keys == [backend.keys(name).config.encode()]
    assert await backend.redis.memory_usage(keys[0], samples=0) <= 216


@COUNTERS
async def test_an_overall_counters_state_follows_set_rate_expire_and_delete(store, name, algorithm):
    await early_in_window(store, 3600, 3)
    limiter = await configured(store, name, [Rate(5, 3600)], algorithm)
    assert await limiter.try_acquire(3)
    await limiter.set_rate(
        RateLimiterConfig.build(OVERALL, [Rate(5, 3600)], algorithm=algorithm), keep_state=True
    )
    assert await limiter.available_permits() == 2  # kept
    rates = [Rate(5, 3600), Rate(4, 60)]
    await limiter.set_rate(
        RateLimiterConfig.build(OVERALL, rates, algorithm=algorithm), keep_state=True
    )
    assert await limiter.available_permits() == 2  # kept; the added rate starts afresh
    assert await limiter.try_acquire(2)
    assert await limiter.update_rate(
        RateLimiterConfig.build(OVERALL, [Rate(5, 3600)], algorithm=algorithm), keep_state=True
    )
    assert await limiter.available_permits() == 0
    await limiter.set_rate(
        RateLimiterConfig.build(OVERALL, [Rate(6, 3600)], algorithm=algorithm), keep_state=False
    )
    assert await limiter.available_permits() == 6  # afresh
    await assert_stored_keys(store, 1)
    if store.is_redis:
        assert "state" not in await config_fields(store, name)
    assert await limiter.try_acquire(4)
    # expire: the state goes with the config, and comes back empty.
    assert await limiter.expire(timedelta(milliseconds=200))
    assert await limiter.available_permits() == 2
    if store.is_redis:
        backend = store.backend()
        assert isinstance(backend, RedisBackend)
        assert 0 < await backend.redis.pttl(backend.keys(name).config) <= 200
    await asyncio.sleep(0.3)
    assert await limiter.get_config() is None
    await assert_stored_keys(store, 0)
    await limiter.set_rate(
        RateLimiterConfig.build(OVERALL, [Rate(6, 3600)], algorithm=algorithm), keep_state=True
    )
    assert await limiter.available_permits() == 6
    assert await limiter.try_acquire(5)
    assert await limiter.expire(timedelta(seconds=60))
    assert await limiter.clear_expire()
    assert await limiter.available_permits() == 1  # the state outlives clear_expire
    assert await limiter.delete()
    await assert_stored_keys(store, 0)
    assert not await limiter.delete()
    await limiter.set_rate(
        RateLimiterConfig.build(OVERALL, [Rate(6, 3600)], algorithm=algorithm), keep_state=True
    )
    assert await limiter.available_permits() == 6  # nothing of the deleted limiter is left


@COUNTERS
async def test_a_counters_rate_type_change_starts_every_budget_afresh(store, name, algorithm):
    await early_in_window(store, 3600, 2)
    a = RateLimiter(name, new_client(store, "a"))
    await a.set_rate(RateLimiterConfig.build(OVERALL, [Rate(5, 3600)], algorithm=algorithm))
    assert await a.try_acquire(4)
    await a.set_rate(
        RateLimiterConfig.build(PER_CLIENT, [Rate(5, 3600)], algorithm=algorithm), keep_state=True
    )
    assert await a.available_permits() == 5
    assert await a.try_acquire(3)
    await assert_stored_keys(store, 3)  # config, registry, a's value key
    if store.is_redis:
        assert "state" not in await config_fields(store, name)
    await a.set_rate(
        RateLimiterConfig.build(OVERALL, [Rate(5, 3600)], algorithm=algorithm), keep_state=True
    )
    assert await a.available_permits() == 5
    assert await a.try_acquire(1)
    await assert_stored_keys(store, 1)  # a's keys are retired; the state is in the config
    await a.set_rate(
        RateLimiterConfig.build(PER_CLIENT, [Rate(5, 3600)], algorithm=algorithm), keep_state=True
    )
    assert await a.available_permits() == 5  # neither a's old value key nor the OVERALL state


@pytest.mark.slow
async def test_several_rates_and_a_token_bucket_on_a_real_cluster(
    redis_cluster: Cluster, cluster_redis: RedisCluster
) -> None:
    backend = RedisBackend(cluster_redis, client_id="c1")
    rates = [Rate(2, 30), Rate(3, 60)]
    sliding = RateLimiter("{several}:rates", backend)
    await sliding.set_rate(RateLimiterConfig.build(PER_CLIENT, rates))
    bucket = RateLimiter("bucket ü", backend)
    await bucket.set_rate(
        RateLimiterConfig.build(OVERALL, rates, algorithm=BUCKET, min_spacing=0.01)
    )
    assert [await sliding.try_acquire() for _ in range(3)] == [True, True, False]
    assert await RateLimiter(sliding.name, backend.with_client("c2")).try_acquire(2)
    assert await bucket.try_acquire(2)
    assert not await bucket.try_acquire(timeout=1)
    await bucket.release(2)
    assert await bucket.try_acquire(timeout=0.1)
    where = masters_holding(redis_cluster)
    # sliding: config, registry, and per client a value key and a ZSET per rate; bucket: the
    # config, which holds its state
    for limiter, count in ((sliding, 2 + 2 * 2 * 2), (bucket, 1)):
        tag = backend.keys(limiter.name).tag
        mine = [k for k in where if k.startswith(tag + ":") and not k.endswith(":released")]
        assert len(mine) == count, mine
        assert len({where[key] for key in mine}) == 1, mine
        assert len({slot(key) for key in mine}) == 1, mine
    assert await sliding.delete() and await bucket.delete()
