"""Learning a partner's quota: one learned rate in the store, shared by every process.

Each case runs on every store (memory, fakeredis, redis-server, Valkey) with a clock the test
moves (``ManualClock``): the point is what the store decides, not when. Several backends on
one store stand for the processes of a fleet; each has its own Learner, as each process would.
"""

from __future__ import annotations

import math

import pytest

from aiolimit import (
    InvalidArgumentError,
    Learner,
    MemoryBackend,
    Observer,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
    ShardedRateLimiter,
    observe,
)
from tests.conformance import ManualClock, advance

INTERVAL = 10  # seconds: long, since Redis expires keys on its own clock


async def fleet(store, name, clock, processes=5, rate=20):
    """``processes`` limiters of one name, each on a backend of its own, the first with the
    config (``rate`` per INTERVAL, the ceiling)."""
    limiters = [RateLimiter(name, store.backend(clock=clock)) for _ in range(processes)]
    await limiters[0].set_rate(RateLimiterConfig.build(RateType.OVERALL, rate, INTERVAL))
    return limiters


async def permits_in_force(limiter):
    return (await limiter.get_config()).rate


async def test_learning_starts_at_half_the_ceiling_and_keeps_the_grants_made(store, name):
    clock = ManualClock()
    (limiter,) = await fleet(store, name, clock, 1)
    assert await limiter.try_acquire(8)
    learned = await Learner(limiter).read()
    assert (learned.permits, learned.ceiling, learned.interval_us) == (10, 20, INTERVAL * 10**6)
    assert await permits_in_force(limiter) == 10
    assert await limiter.available_permits() == 2  # the 8 granted still count
    await Learner(limiter).refused()
    assert await permits_in_force(limiter) == 5  # a rate that never held: halved
    assert not await limiter.try_acquire(1)  # 8 granted, 5 allowed: nothing over-admitted


async def test_many_processes_refused_in_one_episode_cut_the_rate_once(store, name):
    clock = ManualClock()
    limiters = await fleet(store, name, clock)
    await Learner(limiters[0]).read()
    grants = [await limiter.reserve(1) for limiter in limiters[:2]]  # decided before the cut
    for limiter in limiters:  # every process hears of 429s of calls made before the cut
        for acquired in grants:
            await Learner(limiter).refused(acquired)
    assert await permits_in_force(limiters[0]) == 5  # one cut, not 10 of them
    await advance(store, clock, 0.1)
    later = await limiters[3].reserve(1)  # decided under the cut rate: a new episode
    await Learner(limiters[3]).refused(later)
    assert await permits_in_force(limiters[0]) == 2


async def test_a_refusal_without_its_grant_is_a_new_episode_a_quarter_interval_after_the_cut(
    store, name
):
    clock = ManualClock()
    limiters = await fleet(store, name, clock)
    await Learner(limiters[0]).refused()
    await advance(store, clock, INTERVAL / 4 - 1)
    await Learner(limiters[1]).refused()
    assert await permits_in_force(limiters[0]) == 5
    await advance(store, clock, 1)
    await Learner(limiters[2]).refused()
    assert await permits_in_force(limiters[0]) == 2


async def test_successes_increase_the_rate_at_most_once_per_interval(store, name):
    clock = ManualClock()
    limiters = await fleet(store, name, clock)
    await Learner(limiters[0]).read()
    for limiter in limiters:  # within the first interval: no increase
        await succeeded(limiter)
    assert await permits_in_force(limiters[0]) == 10
    await advance(store, clock, INTERVAL)
    for limiter in limiters:
        await succeeded(limiter)
    assert await permits_in_force(limiters[0]) == 11  # one step, for the whole fleet
    await advance(store, clock, INTERVAL / 2)
    await succeeded(limiters[1])
    assert await permits_in_force(limiters[0]) == 11
    await advance(store, clock, INTERVAL / 2)
    await succeeded(limiters[2])
    assert await permits_in_force(limiters[0]) == 12  # (the step doubles while it holds, up
    # to an eighth of the rate: a probe too high costs as many refusals as it overshoots)


async def test_a_failed_probe_goes_back_to_the_level_that_held_and_waits_max_hold(store, name):
    """Above every level that held, a failed probe is tried again only after ``max_hold``:
    not two intervals later, which would cost a ``429`` every time the limit is found."""
    clock = ManualClock()
    (limiter,) = await fleet(store, name, clock, 1)
    learner = Learner(limiter, max_hold=4 * INTERVAL)
    await learner.read()
    await advance(store, clock, INTERVAL)
    await succeeded(limiter)  # 10 held: probe 11
    await advance(store, clock, 1)
    learned = await learner.refused()
    assert (learned.permits, learned.good, learned.bad) == (10, 10, 11)
    assert learned.hold_us == 4 * INTERVAL * 10**6
    tried = []
    for _ in range(4):
        await advance(store, clock, INTERVAL)
        tried.append((await succeeded(limiter)).permits)
    assert tried == [10, 10, 10, 11]  # 11 failed: only after the hold


async def test_the_rate_stays_between_the_floor_and_the_ceiling(store, name):
    clock = ManualClock()
    (limiter,) = await fleet(store, name, clock, 1)
    for _ in range(12):  # a hostile partner: every call refused, episode after episode
        await advance(store, clock, 3)
        await Learner(limiter).refused()
    assert await permits_in_force(limiter) == 1  # the floor: 5 % of 20, at least one permit
    assert await limiter.try_acquire(1)  # slow, never stopped
    for _ in range(40):
        await advance(store, clock, INTERVAL)
        await succeeded(limiter)
    assert await permits_in_force(limiter) == 20  # back to the ceiling, never above it
    await Learner(limiter).stated(10**6, 1)
    assert await permits_in_force(limiter) == 20


async def test_a_stated_limit_is_taken_at_once_scaled_to_the_interval(store, name):
    clock = ManualClock()
    (limiter,) = await fleet(store, name, clock, 1)
    learned = await Learner(limiter).stated(72, 60)  # 72 a minute: 12 per 10 s
    assert (learned.permits, learned.stated) == (12, 12)
    assert await permits_in_force(limiter) == 12
    for _ in range(3):  # no probing past a stated limit
        await advance(store, clock, INTERVAL)
        await succeeded(limiter)
    assert await permits_in_force(limiter) == 12
    await Learner(limiter).stated(0, 1)  # absurd: ignored
    assert await permits_in_force(limiter) == 12


async def test_a_store_that_lost_the_learned_state_starts_again_from_half_the_ceiling(store, name):
    clock = ManualClock()
    (limiter,) = await fleet(store, name, clock, 1)
    learner = Learner(limiter, ceiling=20, interval=INTERVAL)  # (as rate= gives it)
    await learner.stated(6, INTERVAL)
    await forget_learned(limiter)
    assert (await learner.read()).permits == 6  # the config's rate, lower than half
    await advance(store, clock, INTERVAL)
    assert (await succeeded(limiter, ceiling=20, interval=INTERVAL)).permits == 7
    await forget_learned(limiter)
    await limiter.set_rate(
        RateLimiterConfig.build(RateType.OVERALL, 20, INTERVAL)
    )  # a writer put the ceiling back
    assert (await learner.read()).permits == 10


async def test_ensure_rate_leaves_a_learned_rate_alone(store, name):
    clock = ManualClock()
    first = RateLimiter(
        name,
        store.backend(clock=clock),
        rate=RateLimiterConfig.build(RateType.OVERALL, 20, INTERVAL),
    )
    assert await first.try_acquire()
    await Learner(first).refused()
    other = RateLimiter(
        name,
        store.backend(clock=clock),
        rate=RateLimiterConfig.build(RateType.OVERALL, 20, INTERVAL),
    )
    assert await other.try_acquire()  # a process starting: its rate= is the ceiling
    assert await permits_in_force(other) == 5


async def test_the_observer_hears_of_each_learned_rate(store, name):
    clock = ManualClock()
    (limiter,) = await fleet(store, name, clock, 1)
    heard = []

    class Heard(Observer):
        def learned(self, name, permits, ceiling, interval):
            heard.append((name, permits, ceiling, interval))

    previous = observe(Heard())
    try:
        learner = Learner(limiter)
        await learner.read()
        await learner.read()
        await learner.refused()
    finally:
        observe(previous)
    assert heard == [(name, 10, 20, INTERVAL), (name, 5, 20, INTERVAL)]


async def test_a_ceiling_of_other_intervals_than_the_config_is_refused(store, name):
    clock = ManualClock()
    (limiter,) = await fleet(store, name, clock, 1)
    with pytest.raises(InvalidArgumentError, match="intervals"):
        await Learner(limiter, ceiling="20/minute").read()


@pytest.mark.parametrize(
    "knobs",
    [
        {"floor": 0},
        {"start": 1.5},
        {"decrease": 1},
        {"step": math.nan},
        {"max_hold": -1},
        {"interval": 1},
        {"ceiling": 0, "interval": 1},
        {"floor": True},
    ],
)
def test_bad_knobs_raise_invalid_argument(knobs):
    with pytest.raises(InvalidArgumentError):
        Learner(RateLimiter("learn-knobs", MemoryBackend()), **knobs)


async def test_bad_calls_raise_invalid_argument():
    learner = Learner(RateLimiter("learn-calls", MemoryBackend()))
    for quota, window in ((-1, 1), (5, 0), (1.5, 1), (5, math.inf)):
        with pytest.raises(InvalidArgumentError):
            await learner.stated(quota, window)
    with pytest.raises(InvalidArgumentError):
        Learner(ShardedRateLimiter("learn-sharded", MemoryBackend(), shards=2))


async def succeeded(limiter, **knobs):
    """A success told while the limiter is used up (as callers that send as fast as they
    are let keep it): a rate that is not used is not raised."""
    left = await limiter.available_permits()
    if left:
        assert await limiter.try_acquire(left)
    return await Learner(limiter, **knobs).succeeded()


async def test_a_rate_not_used_is_not_raised(store, name):
    clock = ManualClock()
    (limiter,) = await fleet(store, name, clock, 1)
    await Learner(limiter).read()
    assert await limiter.try_acquire(7)  # 3 of 10 left: more than a quarter
    await advance(store, clock, INTERVAL)
    assert await limiter.try_acquire(7)
    assert (await Learner(limiter).succeeded()).permits == 10
    assert await limiter.try_acquire(1)  # a quarter left, or less: used
    assert (await Learner(limiter).succeeded()).permits == 11


async def forget_learned(limiter):
    backend = limiter.backend
    if isinstance(backend, RedisBackend):
        await backend.redis.delete(backend.keys(limiter.name).learned)
    else:
        backend._shared.learning.states.clear()  # (the memory twin of that key)


def stepper(store, clock, limiter, **knobs):
    """``after(seconds, event)``: the clock moved, then one report; the permits in force."""

    async def after(seconds, event="succeeded"):
        await advance(store, clock, seconds)
        if event == "succeeded":
            return (await succeeded(limiter, **knobs)).permits
        if event == "fell":  # the limit fell: a whole burst of calls refused
            grants = [await limiter.reserve(1) for _ in range(5)]
            for acquired in grants:
                learned = await Learner(limiter, **knobs).refused(acquired)
            return learned.permits
        return (await Learner(limiter, **knobs).refused()).permits

    return after


async def held_at_twelve_with_thirteen_failing(store, name):
    """A limiter whose learned rate found the partner's 12: 13 probed and refused."""
    clock = ManualClock()
    limiters = await fleet(store, name, clock)
    after = stepper(store, clock, limiters[0], start=0.6, max_hold=8 * INTERVAL)
    assert (await Learner(limiters[0], start=0.6).read()).permits == 12
    assert await after(INTERVAL) == 13  # 12 held: probe 13
    assert await after(3, "refused") == 12  # 13 fails: back to 12, which held
    assert [await after(INTERVAL) for _ in range(2)] == [12, 12]  # 13 waits max_hold (8)
    return clock, limiters, after


async def test_a_level_that_held_refused_by_a_burst_is_halved_once_for_the_fleet(store, name):
    clock, limiters, after = await held_at_twelve_with_thirteen_failing(store, name)
    await advance(store, clock, 3)
    grants = [await limiter.reserve(1) for limiter in limiters]  # decided at 12
    for limiter in limiters:  # the limit fell: every process hears of 429s
        for acquired in grants:
            await Learner(limiter).refused(acquired)
    assert await permits_in_force(limiters[0]) == 6  # one cut: not a step, then more
    assert await after(INTERVAL / 4 + 0.1, "refused") == 3  # refused under the cut: it fell on


async def test_a_lone_refusal_of_a_level_that_held_is_one_step_down(store, name):
    """A late arrival (a caller stalled past the margin) is refused alone; a fall refuses
    the calls of a whole window: more than a quarter of the level."""
    clock, limiters, _ = await held_at_twelve_with_thirteen_failing(store, name)
    await advance(store, clock, 3)
    grants = [await limiter.reserve(1) for limiter in limiters[:4]]
    learned = [(await Learner(limiters[0]).refused(acquired)).permits for acquired in grants]
    assert learned == [11, 11, 11, 6]  # the fourth of the episode (12 / 4 = 3): a fall
    await advance(store, clock, 3)
    later = await limiters[0].reserve(1)
    assert (await Learner(limiters[0]).refused(later)).permits == 3  # (6 had not held)


async def test_after_a_late_arrival_the_rate_is_back_within_two_intervals(store, name):
    _, _, after = await held_at_twelve_with_thirteen_failing(store, name)
    assert await after(3, "refused") == 11  # one late arrival
    assert [await after(INTERVAL) for _ in range(2)] == [12, 12]  # 13 after its own hold
    assert [await after(INTERVAL) for _ in range(7)] == [12] * 6 + [13]  # (8 intervals)


async def test_after_a_fall_one_step_is_probed_and_a_rise_climbs_back_fast(store, name):
    *_, after = await held_at_twelve_with_thirteen_failing(store, name)
    assert await after(3, "fell") == 6  # the limit fell
    assert await after(INTERVAL) == 7  # one step (half-way to 12 would overshoot a fall)
    assert await after(3, "refused") == 6  # 7 fails: the limit is 6; 7 waits 2 intervals
    assert [await after(INTERVAL) for _ in range(2)] == [6, 7]
    assert await after(INTERVAL) == 12  # 7 held: the limit rose, back where it fell from
    assert await after(INTERVAL) == 12  # never past it: 13 failed there


async def test_below_where_it_fell_from_a_failed_probe_waits_at_most_four_intervals(store, name):
    """After a fall the limit may come back at any time: the level above the one that holds
    is probed again after 2, then 4 intervals, never longer, however long ``max_hold`` is
    (above every level that held, the wait grows to ``max_hold``): a rise back is found
    within about four intervals."""
    clock, limiters, _ = await held_at_twelve_with_thirteen_failing(store, name)
    after = stepper(store, clock, limiters[0], start=0.6, max_hold=30 * INTERVAL)
    assert await after(3, "fell") == 6  # the limit fell from 12
    assert await after(INTERVAL) == 7  # probe 7
    tried = []
    for _ in range(4):  # 7 fails each time: the limit stays 6
        assert await after(1, "refused") == 6
        waited = 0
        while waited < 40 and await after(INTERVAL) == 6:
            waited += 1
        tried.append(waited)
    assert tried == [1, 3, 3, 3], tried  # (2 and 4 intervals after the failure, then 4 on)


async def test_a_level_refused_before_it_held_is_climbed_back_to_fast(store, name):
    clock = ManualClock()
    (limiter,) = await fleet(store, name, clock, 1)
    after = stepper(store, clock, limiter, start=0.8)
    assert (await Learner(limiter, start=0.8).read()).permits == 16
    assert await after(1, "refused") == 8  # (a start's first window, say: late arrivals)
    assert [await after(INTERVAL) for _ in range(5)] == [9, 11, 15, 16, 17]  # (not +1 each)


async def test_back_where_it_fell_from_the_level_above_waits_the_hold_it_had(store, name):
    *_, after = await held_at_twelve_with_thirteen_failing(store, name)
    assert await after(3, "fell") == 6  # the limit fell
    assert [await after(INTERVAL) for _ in range(3)] == [7, 9, 12]  # it came back: so does 12
    # 13 failed before the fall: probed again only after its hold (max_hold, 8
    # intervals), not one interval after 12 is back
    assert [await after(INTERVAL) for _ in range(8)] == [12] * 7 + [13]


@pytest.mark.parametrize("seed", range(6))
async def test_the_memory_twin_learns_as_learn_lua_does(redis_server, name, seed):
    """Random reports (refusals with and without their grants, alone or a window's at
    once, successes, stated limits, at random times, the budget used or not) on a real
    redis-server and on the memory backend, each with its own clock moved alike: every
    answer and rate the same."""
    import random

    from redis.asyncio import Redis

    from tests.conformance import ManualClock

    chance = random.Random(seed)
    redis = Redis.from_url(redis_server.url)
    clocks = [ManualClock(), ManualClock()]
    backends = [MemoryBackend(clock=clocks[0]), RedisBackend(redis, clock=clocks[1])]
    limiters = [RateLimiter(name, backend) for backend in backends]
    seen = set()
    try:
        for limiter in limiters:
            await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 40, INTERVAL))
        for _ in range(60):
            step = chance.choice((0.5, 1, 3, INTERVAL, 2 * INTERVAL))
            event = chance.choice(("refused", "refused", "succeeded", "succeeded", "stated"))
            take = chance.randrange(0, 12)
            quota = chance.randrange(0, 60)
            with_grant = chance.random() < 0.7
            burst = chance.choice((1, 1, 5))  # (refusals of one window, told one by one)
            answers = []
            for limiter, clock in zip(limiters, clocks, strict=True):
                clock.advance(step)
                take = min(take, (await limiter.get_config()).rate)
                acquired = await limiter.reserve(take) if take else None
                learner = Learner(limiter, max_hold=5 * INTERVAL)
                if event == "refused":
                    for _ in range(burst):
                        learned = await learner.refused(acquired if with_grant else None)
                elif event == "succeeded":
                    learned = await learner.succeeded(acquired if with_grant else None)
                else:
                    learned = await learner.stated(quota, INTERVAL)
                answers.append((learned, await limiter.get_config()))
            assert answers[0] == answers[1], (event, step, take)
            seen.add(answers[0][0].permits)
        assert len(seen) >= 4, seen  # (the rate moved about)
    finally:
        await limiters[1].delete()
        await redis.delete(backends[1].keys(name).learned)
        await redis.aclose()


async def test_a_success_proves_a_level_only_for_a_call_granted_an_interval_after_the_raise(
    store, name
):
    """A probe's extra call fails an interval after the raise, when the partner's window
    holds the new level in full: the calls that succeed before that prove nothing."""
    clock = ManualClock()
    (limiter,) = await fleet(store, name, clock, 1)
    learner = Learner(limiter, start=0.6)
    await learner.read()
    await advance(store, clock, INTERVAL)
    assert (await succeeded(limiter)).permits == 13  # 12 held: probe 13
    await advance(store, clock, 1)
    early = await limiter.reserve(1)  # granted under 13, a second after the raise
    await advance(store, clock, INTERVAL)
    if left := await limiter.available_permits():
        assert await limiter.try_acquire(left)
    learned = await Learner(limiter, start=0.6).succeeded(early)
    assert learned is not None and (learned.permits, learned.good) == (13, 12)  # unproven
    late = await limiter.reserve(1)
    assert (await learner.refused(late)).permits == 12  # the probe failed: back, not halved


async def test_a_learner_tells_the_first_success_that_can_prove_a_level_at_once(store, name):
    """Successes are told at most four times an interval, but one that can prove the
    level (granted an interval after the raise) is told at once: the fleet's next increase
    is one interval on, not two."""
    clock = ManualClock()
    (limiter,) = await fleet(store, name, clock, 1)
    learner = Learner(limiter, start=0.6)
    await learner.read()
    early = await limiter.reserve(1)
    assert await learner.succeeded(early) is None  # granted with the level: proves nothing
    await advance(store, clock, INTERVAL)
    if left := await limiter.available_permits():
        assert await limiter.try_acquire(left)
    proof = await limiter.reserve(1)
    learned = await learner.succeeded(proof)  # (told: no other success of this level was)
    assert learned is not None and learned.permits == 13


async def test_a_probe_refused_by_its_own_overshoot_is_not_a_fall(store, name):
    """A probe two steps over refuses two calls a window: back to what held, not halved;
    more than that (a quarter of the level besides) is a fall."""
    _, limiters, after = await held_at_twelve_with_thirteen_failing(store, name)
    assert await after(3, "fell") == 6  # the limit fell from 12 to 6
    assert [await after(INTERVAL) for _ in range(2)] == [7, 9]  # 7 held: 9 (a step of 2)
    grants = [await limiters[0].reserve(1) for _ in range(4)]
    refused = [(await Learner(limiters[0]).refused(acquired)).permits for acquired in grants]
    assert refused == [7, 7, 7, 3]  # 2 over 7: its own; 2 more (7 // 4 = 1 besides): a fall


@pytest.mark.looptime
async def test_a_raise_wakes_the_call_its_process_has_waiting():
    """The process that raised the rate takes the new permit at once (its waiting call was
    asleep until a slot of the old rate): the new level is proven an interval later, so
    the fleet climbs one step an interval, not one every two."""
    import asyncio

    import httpx

    from aiolimit.httpx import RateLimitedTransport

    limiter = RateLimiter("wake", MemoryBackend(), rate=RateLimiterConfig.build("overall", 4, 10))
    loop = asyncio.get_running_loop()
    began = loop.time()
    starts: list[float] = []

    async def answer(request: httpx.Request) -> httpx.Response:
        starts.append(round(loop.time() - began, 3))
        await asyncio.sleep(0.5)  # (the partner's time: the fifth call is asleep by then)
        return httpx.Response(200)

    transport = RateLimitedTransport(limiter, httpx.MockTransport(answer), learn=True)
    async with httpx.AsyncClient(transport=transport) as client:
        await asyncio.gather(*(client.get("https://partner.example/") for _ in range(5)))
    assert starts == [0, 0, 10, 10, 10.5]  # 2 of 4 per 10 s; 3 once 2 held 10 s: at once
