"""The behaviour every backend must share, through the public API only.

Each test runs on the memory backend (virtual time: exact), fakeredis, a real redis-server and
a real Valkey (real time: short intervals, tolerances in `conformance.tolerance`).
Redisson's own tests are ported in test_conformance_redisson.py.
"""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta

import pytest
from conformance import (
    AttemptClock,
    assert_sliding_window,
    assert_stored_keys,
    check_after,
    manual_clock,
    new_client,
    now,
    per_permit,
    take,
    tolerance,
    until,
    when_free,
)

import aiolimit
from aiolimit import (
    InvalidArgumentError,
    LimiterError,
    NotConfiguredError,
    RateLimiter,
    RateLimiterConfig,
    RateType,
)
from aiolimit.backends import Refusal

OVERALL = RateType.OVERALL
PER_CLIENT = RateType.PER_CLIENT


async def configured(store, name, rate, interval, rate_type=OVERALL, **options):
    limiter = RateLimiter(name, store.backend())
    await limiter.set_rate(RateLimiterConfig.build(rate_type, rate, interval, **options))
    return limiter


# -- waiting ------------------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_refused_request_waits_until_enough_permits_are_free(store, name):
    # rate 3 per 0.5 s, grants at t0, t0+0.15, t0+0.3: a request for 2 needs the grants of t0
    # and t0+0.15 to leave the window, so it succeeds at t0+0.65, not when t0's leaves (t0+0.5).
    limiter = await configured(store, name, 3, 0.5)
    first = await take(limiter)
    await asyncio.sleep(0.15)
    second = await take(limiter)
    await asyncio.sleep(0.15)
    assert await take(limiter)
    start = now()
    assert await limiter.try_acquire(2, timeout=None)
    tol = tolerance(store)
    assert now() >= second[0] + 0.5 - tol.early, "granted before enough permits were free"
    check_after(store, second, 0.5, "the 2-permit grant")
    assert now() - start > 0.3
    assert first[1] + 0.5 < now()


async def test_try_acquire_fails_at_once_when_the_wait_exceeds_the_timeout(store, name):
    limiter = await configured(store, name, 1, 10)
    assert await limiter.try_acquire()
    start = now()
    assert not await limiter.try_acquire(timeout=5)
    assert not await limiter.try_acquire(timeout=timedelta(seconds=9))
    tolerance(store).check(now(), start, "the refusals (a timeout that cannot be met, slept out)")


async def test_try_acquire_with_a_timeout_waits_for_the_permit(store, name):
    limiter = await configured(store, name, 1, 0.2)
    granted = await take(limiter)
    assert await limiter.try_acquire(timeout=1)
    check_after(store, granted, 0.2, "the permit")


@pytest.mark.slow
async def test_timeout_none_and_acquire_wait_as_long_as_it_takes(store, name):
    limiter = await configured(store, name, 1, 0.15)
    granted = await take(limiter)
    assert await limiter.try_acquire(timeout=None)
    check_after(store, granted, 0.15, "try_acquire(timeout=None)")
    await limiter.acquire()
    check_after(store, granted, 0.3, "acquire()")
    async with limiter:
        check_after(store, granted, 0.45, "async with")
    assert await limiter.available_permits() == 0


@pytest.mark.slow
async def test_waiting_tasks_are_served_in_arrival_order(store, name, asleep):
    # Two RateLimiter objects with one name on one backend share one queue.
    backend = store.backend()
    limiter, twin = RateLimiter(name, backend), RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 1, 0.1))
    assert await limiter.try_acquire()
    served: list[int] = []

    async def waiter(i: int) -> None:
        await (limiter if i % 2 else twin).acquire()
        served.append(i)

    tasks = []
    for i in range(5):
        tasks.append(asyncio.create_task(waiter(i)))
        await asleep.reach(name, i + 1)  # waiter i holds its reservation: arrivals in order
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert served == [0, 1, 2, 3, 4]


@pytest.mark.slow
async def test_a_large_request_is_not_starved_by_a_stream_of_small_ones(store, name):
    # rate 5 per 0.5 s; a 1-permit request arrives every 0.1 s; a 5-permit request arrives at
    # 0.25 s, when the grants of 0, 0.1 and 0.2 s still fill the window. It is served once
    # they have left (0.7 s); the small requests arriving after it wait their turn.
    limiter = await configured(store, name, 5, 0.5)
    small: dict[int, tuple[float, float]] = {}
    big: list[tuple[float, float]] = []

    async def request_one(i: int) -> None:
        small[i] = await take(limiter, timeout=None)

    async def request_five() -> None:
        big.append(await take(limiter, 5, timeout=None))

    tasks = []
    for i in range(8):
        tasks.append(asyncio.create_task(request_one(i)))
        await asyncio.sleep(0.05)
        if i == 2:
            big_arrival = now()
            tasks.append(asyncio.create_task(request_five()))
        await asyncio.sleep(0.05)
    try:
        await asyncio.wait_for(tasks[3], 2)  # the big request
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert sorted(small) == [0, 1, 2]
    granted = big[0][1]
    # When the last of the three grants before it leaves the window (at 0.7 s, on time).
    tolerance(store).check_span(
        (granted, granted), (small[2][0] + 0.5, small[2][1] + 0.5), "the 5-permit grant"
    )
    assert small[2][1] < big_arrival < granted


async def test_waiters_on_one_limiter_never_delay_waiters_on_another(store, name):
    backend = store.backend()
    busy = RateLimiter(f"{name}-busy", backend)
    await busy.set_rate(RateLimiterConfig.build(OVERALL, 1, 10))
    assert await busy.try_acquire()
    stuck = [asyncio.create_task(busy.acquire()) for _ in range(3)]
    free = RateLimiter(name, backend)
    await free.set_rate(RateLimiterConfig.build(OVERALL, 1, 0.2))
    try:
        granted = await take(free)
        assert granted is not None
        assert await free.try_acquire(timeout=1)
        check_after(store, granted, 0.2, "the other limiter's permit")
        assert not any(task.done() for task in stuck)
    finally:
        for task in stuck:
            task.cancel()
        await asyncio.gather(*stuck, return_exceptions=True)


# -- cancellation -------------------------------------------------------------------------------


@pytest.mark.slow
async def test_cancelled_waiters_hold_no_permits_and_the_others_proceed(store, name, asleep):
    limiter = await configured(store, name, 2, 0.3)
    granted = await take(limiter, 2)
    head = asyncio.create_task(limiter.acquire(2))
    await asleep.reach(name, 1)
    middle = asyncio.create_task(limiter.acquire(1))
    await asleep.reach(name, 2)
    last = asyncio.create_task(limiter.acquire(1))
    await asleep.reach(name, 3)
    head.cancel()  # sleeping until its permits are free
    middle.cancel()  # waiting for its turn
    await asyncio.gather(head, middle, return_exceptions=True)
    assert head.cancelled() and middle.cancelled()

    await asyncio.wait_for(last, 2)
    # Served once a permit is free, and no later than its turn behind the cancelled two.
    at = now()
    tolerance(store).check_span((at, at), (granted[0] + 0.3, granted[1] + 0.6), "the last waiter")
    assert await limiter.available_permits() == 1
    await asyncio.sleep(0.35)
    assert await limiter.available_permits() == 2


async def test_a_caller_cancelled_while_its_call_is_queued_keeps_no_permits(store, name):
    # Calls queued behind one in flight go in a round trip of their own task: a caller
    # cancelled meanwhile gets nothing, and the grant made for it is handed back exactly.
    limiter = await configured(store, name, 3, 10)
    first = asyncio.create_task(limiter.acquire(1))
    queued = asyncio.create_task(limiter.acquire(2))
    await asyncio.sleep(0)  # both are on their way; the second waits for the first's trip
    queued.cancel()
    await asyncio.gather(first, queued, return_exceptions=True)
    assert first.done() and not first.cancelled()
    if store.is_redis:
        assert queued.cancelled(), "cancelled while its script call was queued or in flight"
    # (The memory backend decides without awaiting: both are done before the cancel lands.)
    expected = 2 if queued.cancelled() else 0
    await until(limiter.available_permits, lambda n: n == expected, "a cancelled caller's grant")
    assert [await limiter.try_acquire() for _ in range(3)] == [True] * expected + [False] * (
        3 - expected
    )


async def test_a_task_cancelled_during_its_attempt_keeps_no_permits(store, name):
    # Even with nothing else in flight, the call runs in a round trip of its own task: the
    # cancelled caller returns at once, and the grant made for it is handed back exactly.
    limiter = await configured(store, name, 3, 10)
    task = asyncio.create_task(limiter.acquire(2))
    await asyncio.sleep(0)  # the attempt is on its way
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    if store.is_redis:
        assert task.cancelled(), "cancelled while its script call was in flight"
    # (The memory backend decides without awaiting: the task is done before it can be cancelled.)
    expected = 3 if task.cancelled() else 1
    await until(limiter.available_permits, lambda n: n == expected, "a cancelled caller's grant")
    assert [await limiter.try_acquire() for _ in range(4)] == [True] * expected + [False] * (
        4 - expected
    )


# -- release ------------------------------------------------------------------------------------


async def test_an_expiring_grant_frees_only_its_own_permits(store, name):
    # On a clock the test moves (a long window, so that Redis keeps the keys on its own clock).
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 2, 30))
    assert await limiter.try_acquire()
    clock.advance(20)
    assert await limiter.try_acquire()
    clock.advance(15)  # the first grant has left the window, the second has not
    assert await limiter.available_permits() == 1
    assert await limiter.try_acquire()
    assert await limiter.available_permits() == 0
    assert not await limiter.try_acquire()


async def test_grants_of_one_digit_and_of_several_free_exactly_their_permits(store, name):
    # A grant's member begins with its permits: 3 (one digit) and 12, 100 (several) each
    # free exactly what they took when they leave the window, and so does a waiter's walk.
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 120, 30))
    for permits, after in ((3, 5), (12, 5), (100, 5)):
        assert await limiter.try_acquire(permits)
        clock.advance(after)
    assert await limiter.available_permits() == 5
    assert await limiter.wait_time(20) == pytest.approx(20.0)  # when the 12 have gone too
    clock.advance(16)  # the 3 have left the window
    assert await limiter.available_permits() == 8
    clock.advance(5)  # the 12 too
    assert await limiter.available_permits() == 20
    clock.advance(5)  # and the 100
    assert await limiter.available_permits() == 120
    assert await limiter.try_acquire(120)


@pytest.mark.slow
async def test_release_hands_back_the_most_recent_grants(store, name):
    limiter = await configured(store, name, 5, 0.4)
    oldest = await take(limiter)
    await asyncio.sleep(0.2)
    assert await take(limiter, 2)
    await limiter.release(2)
    assert await limiter.available_permits() == 4
    # Had it handed back the oldest grant, one permit of the newer one would still count.
    await asyncio.sleep(oldest[1] + 0.4 + 0.05 - now())
    assert await limiter.available_permits() == 5


async def test_release_never_raises_available_above_the_rate(store, name):
    limiter = await configured(store, name, 3, 10)
    await limiter.release(1)  # nothing granted yet
    assert await limiter.available_permits() == 3
    assert await limiter.try_acquire()
    await limiter.release(3)
    assert await limiter.available_permits() == 3
    assert [await limiter.try_acquire() for _ in range(4)] == [True, True, True, False]


async def test_a_released_permit_is_not_counted_again_when_its_grant_expires(store, name):
    limiter = await configured(store, name, 5, 0.3)
    assert await limiter.try_acquire(3)
    assert await limiter.try_acquire(2)
    await limiter.release(3)  # the 2-permit grant and one permit of the 3-permit grant
    assert await limiter.available_permits() == 3
    await asyncio.sleep(0.35)
    assert await limiter.available_permits() == 5
    results = [await limiter.try_acquire() for _ in range(6)]
    assert results == [True] * 5 + [False]


async def test_release_hands_back_only_this_clients_per_client_grants(store, name):
    a = RateLimiter(name, new_client(store, "a"))
    b = RateLimiter(name, new_client(store, "b"))
    await a.set_rate(RateLimiterConfig.build(PER_CLIENT, 3, 10))
    assert await a.try_acquire(2)
    assert await b.try_acquire(2)
    await a.release(2)
    assert await a.available_permits() == 3
    assert await b.available_permits() == 1


# -- configuration ------------------------------------------------------------------------------


async def test_set_rate_with_keep_state_false_restarts_every_budget_full(store, name):
    a = RateLimiter(name, new_client(store, "a"))
    b = RateLimiter(name, new_client(store, "b"))
    await a.set_rate(RateLimiterConfig.build(PER_CLIENT, 3, 10))
    assert await a.try_acquire(3)
    assert await b.try_acquire(2)
    await a.set_rate(RateLimiterConfig.build(PER_CLIENT, 3, 10), keep_state=False)
    assert await a.available_permits() == 3
    assert await b.available_permits() == 3
    await a.set_rate(RateLimiterConfig.build(OVERALL, 3, 10))
    assert await a.try_acquire(3)
    await b.set_rate(RateLimiterConfig.build(OVERALL, 4, 10), keep_state=False)
    assert await a.available_permits() == 4


async def test_set_rate_with_keep_state_counts_the_grants_inside_the_new_window(store, name):
    limiter = await configured(store, name, 5, 1)
    assert await limiter.try_acquire(2)
    await asyncio.sleep(0.3)
    assert await limiter.try_acquire(1)
    # New window 0.2 s: the grant of 0.3 s ago has left it, the fresh one has not.
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 4, 0.2), keep_state=True)
    assert await limiter.available_permits() == 3
    assert await limiter.get_config() == RateLimiterConfig(OVERALL, 4, timedelta(seconds=0.2))


async def test_set_rate_with_keep_state_applies_a_raised_or_lowered_rate(store, name):
    limiter = await configured(store, name, 3, 0.3)
    assert await limiter.try_acquire(3)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 5, 0.3), keep_state=True)
    assert await limiter.available_permits() == 2
    assert await limiter.try_acquire(2)
    await limiter.set_rate(
        RateLimiterConfig.build(OVERALL, 2, 0.3), keep_state=True
    )  # 5 granted, 2 allowed
    assert await limiter.available_permits() == 0
    assert not await limiter.try_acquire()
    await asyncio.sleep(0.35)
    assert await limiter.available_permits() == 2


async def test_update_rate_without_a_config_returns_false_and_writes_nothing(store, name):
    limiter = RateLimiter(name, store.backend())
    assert not await limiter.update_rate(RateLimiterConfig.build(OVERALL, 3, 1))
    assert not await limiter.update_rate(
        RateLimiterConfig.build(PER_CLIENT, 3, 1), keep_state=False
    )
    assert await limiter.get_config() is None
    await assert_stored_keys(store, 0)
    with pytest.raises(NotConfiguredError):
        await limiter.available_permits()


async def test_update_rate_keeps_the_state_by_default(store, name):
    limiter = await configured(store, name, 3, 10)
    assert await limiter.try_acquire(2)
    assert await limiter.update_rate(RateLimiterConfig.build(OVERALL, 4, 10))
    assert await limiter.available_permits() == 2
    assert await limiter.update_rate(RateLimiterConfig.build(OVERALL, 4, 10), keep_state=False)
    assert await limiter.available_permits() == 4


async def test_changing_the_rate_type_clears_the_state(store, name):
    limiter = await configured(store, name, 3, 10)
    assert await limiter.try_acquire(2)
    assert await limiter.update_rate(RateLimiterConfig.build(PER_CLIENT, 3, 10), keep_state=True)
    assert await limiter.available_permits() == 3
    assert await limiter.try_acquire(1)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 3, 10), keep_state=True)
    assert await limiter.available_permits() == 3


async def test_a_rate_type_change_by_one_client_is_seen_by_every_client(store, name):
    a = RateLimiter(name, new_client(store, "a"))
    b = RateLimiter(name, new_client(store, "b"))
    await a.set_rate(RateLimiterConfig.build(OVERALL, 2, 10))
    assert await b.try_acquire(2)
    assert await a.available_permits() == 0
    assert await a.update_rate(RateLimiterConfig.build(PER_CLIENT, 2, 10))
    assert await b.available_permits() == 2
    assert await b.try_acquire(2)
    assert await a.try_acquire(2)
    assert await b.update_rate(RateLimiterConfig.build(OVERALL, 2, 10))
    assert await a.available_permits() == 2
    assert await a.try_acquire(2)
    assert not await b.try_acquire()


async def test_try_set_rate_writes_only_when_no_config_exists(store, name):
    limiter = RateLimiter(name, store.backend())
    assert await limiter.try_set_rate(RateLimiterConfig.build(OVERALL, 3, 10))
    assert await limiter.try_acquire()
    assert not await limiter.try_set_rate(RateLimiterConfig.build(PER_CLIENT, 5, 20))
    assert await limiter.get_config() == RateLimiterConfig(OVERALL, 3, timedelta(seconds=10))
    assert await limiter.available_permits() == 2


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (
            (OVERALL, 3, 0.25, None),
            RateLimiterConfig(OVERALL, 3, timedelta(milliseconds=250), None),
        ),
        (
            ("PER_CLIENT", 7, timedelta(minutes=2), timedelta(hours=1)),
            RateLimiterConfig(PER_CLIENT, 7, timedelta(minutes=2), timedelta(hours=1)),
        ),
        (
            (OVERALL, 10**6, 86_400 * 30, 86_400 * 30),
            RateLimiterConfig(OVERALL, 10**6, timedelta(days=30), timedelta(days=30)),
        ),
        (
            (PER_CLIENT, 1, timedelta(microseconds=1500), 3600.0000015),
            RateLimiterConfig(
                PER_CLIENT, 1, timedelta(microseconds=1500), timedelta(hours=1, microseconds=2)
            ),
        ),
    ],
)
async def test_get_config_round_trips_every_field(store, name, arguments, expected):
    rate_type, rate, interval, keep_alive = arguments
    limiter = RateLimiter(name, store.backend())
    assert await limiter.try_set_rate(
        RateLimiterConfig.build(rate_type, rate, interval, keep_alive=keep_alive)
    )
    config = await limiter.get_config()
    assert config == expected
    assert type(config.rate_type) is RateType and type(config.interval) is timedelta
    # Another client reads the same config.
    assert await RateLimiter(name, new_client(store)).get_config() == expected


# -- lifetime -----------------------------------------------------------------------------------


async def test_delete_removes_every_clients_state_and_reports_false_the_second_time(store, name):
    clients = [RateLimiter(name, new_client(store, f"client-{i}")) for i in range(3)]
    await clients[0].set_rate(RateLimiterConfig.build(PER_CLIENT, 3, 60))
    for i, limiter in enumerate(clients):
        assert await limiter.try_acquire(i + 1)
    assert await clients[1].delete()
    await assert_stored_keys(store, 0)
    for limiter in clients:
        assert await limiter.get_config() is None
    assert not await clients[2].delete()
    assert await clients[2].try_set_rate(RateLimiterConfig.build(PER_CLIENT, 3, 60))
    for limiter in clients:
        assert await limiter.available_permits() == 3


async def test_delete_reaches_a_client_whose_window_was_lengthened(request, store, name):
    # keep_state carries the client's grant into a 60 s window; 0.25 s later, well inside it,
    # delete must still find and remove that client's state.
    a = RateLimiter(name, new_client(store, "a"))
    await a.set_rate(RateLimiterConfig.build(PER_CLIENT, 5, 0.1))
    assert await a.try_acquire(2)
    assert await a.update_rate(RateLimiterConfig.build(PER_CLIENT, 5, 60), keep_state=True)
    assert await a.available_permits() == 3
    await asyncio.sleep(0.25)
    assert await a.delete()
    await assert_stored_keys(store, 0)
    assert await a.try_set_rate(RateLimiterConfig.build(PER_CLIENT, 5, 60))
    assert await a.available_permits() == 5


async def test_grants_taken_after_expire_vanish_with_the_limiter(request, store, name):
    limiter = await configured(store, name, 2, 10)
    assert await limiter.expire(0.2)
    assert await limiter.try_acquire()
    await asyncio.sleep(0.3)
    assert await limiter.get_config() is None
    await assert_stored_keys(store, 0)
    assert await limiter.try_set_rate(RateLimiterConfig.build(OVERALL, 2, 10))
    assert await limiter.available_permits() == 2


async def test_delete_of_an_unknown_limiter_returns_false(store, name):
    assert not await RateLimiter(name, store.backend()).delete()


async def test_expire_makes_config_and_every_clients_state_vanish(store, name):
    a = RateLimiter(name, new_client(store, "a"))
    b = RateLimiter(name, new_client(store, "b"))
    assert not await a.expire(1)  # no config yet
    await a.set_rate(RateLimiterConfig.build(PER_CLIENT, 2, 60))
    assert await a.try_acquire(2)
    assert await b.try_acquire(1)
    assert await b.expire(0.2)
    await asyncio.sleep(0.3)
    await assert_stored_keys(store, 0)
    assert await a.get_config() is None
    assert await a.try_set_rate(RateLimiterConfig.build(PER_CLIENT, 2, 60))
    assert await a.available_permits() == 2
    assert await b.available_permits() == 2


async def test_clear_expire_keeps_the_limiter_and_its_grants(request, store, name):
    limiter = await configured(store, name, 2, 10)
    assert not await limiter.clear_expire()  # no TTL to clear
    assert await limiter.try_acquire(2)
    assert await limiter.expire(0.2)
    assert await limiter.clear_expire()
    assert not await limiter.clear_expire()
    await asyncio.sleep(0.3)
    assert await limiter.get_config() is not None
    assert not await limiter.try_acquire(), "the grants were forgotten inside their window"


async def test_keep_alive_makes_an_idle_limiter_disappear(store, name):
    for _ in range(3):
        before = now()
        limiter = await configured(store, name, 2, 0.1, keep_alive=0.2)
        try:
            assert await limiter.try_acquire()
            break
        except NotConfiguredError:
            # Right: this process stalled for longer than keep_alive (a busy machine) before
            # its first call. Configured again, so that the limiter has been in use.
            assert now() - before >= 0.2 - tolerance(store).early, "gone before keep_alive"
    else:
        raise AssertionError("never in use within keep_alive of being configured")
    await asyncio.sleep(0.3)
    assert await limiter.get_config() is None
    await assert_stored_keys(store, 0)
    with pytest.raises(NotConfiguredError):
        await limiter.try_acquire()


async def test_without_keep_alive_the_config_outlives_the_idle_state(store, name):
    limiter = await configured(store, name, 2, 0.1)
    assert await limiter.try_acquire(2)
    await asyncio.sleep(0.25)
    assert await limiter.get_config() == RateLimiterConfig(OVERALL, 2, timedelta(milliseconds=100))
    await assert_stored_keys(store, 1)  # the config alone
    assert await limiter.available_permits() == 2


# -- rate types ---------------------------------------------------------------------------------


async def test_per_client_budgets_are_independent(store, name):
    a = RateLimiter(name, new_client(store, "a"))
    a_again = RateLimiter(name, new_client(store, "a"))
    b = RateLimiter(name, new_client(store, "b"))
    await a.set_rate(RateLimiterConfig.build(PER_CLIENT, 2, 10))
    assert await a.try_acquire(2)
    assert not await a.try_acquire()
    assert await a_again.available_permits() == 0  # same client id, same budget
    assert await b.available_permits() == 2
    assert await b.try_acquire(2)
    assert not await b.try_acquire()


async def test_clients_without_an_id_get_budgets_of_their_own(store, name):
    first = RateLimiter(name, new_client(store))
    second = RateLimiter(name, new_client(store))
    await first.set_rate(RateLimiterConfig.build(PER_CLIENT, 1, 10))
    assert await first.try_acquire()
    assert await second.try_acquire()


async def test_the_overall_budget_is_shared_by_every_client(store, name):
    a = RateLimiter(name, new_client(store, "a"))
    b = RateLimiter(name, new_client(store, "b"))
    anonymous = RateLimiter(name, new_client(store))
    await a.set_rate(RateLimiterConfig.build(OVERALL, 3, 10))
    assert await a.try_acquire(2)
    assert await b.available_permits() == 1
    assert await b.try_acquire()
    assert not await a.try_acquire()
    assert not await anonymous.try_acquire()


# -- names --------------------------------------------------------------------------------------

HOSTILE_NAMES = [
    "{a}",
    "a",
    "}{",
    "{",
    "}",
    "{}",
    "%7B",
    "%7Ba%7D",
    "%",
    "%25",
    "a b",
    " ",
    "a:value",
    "{a}:value",
    "a}:permits",
    "*",
    "\n",
    "ünïcødé 名前 🚦",
    "x" * 300,
]


async def test_hostile_names_work_and_never_share_state(store, name):
    backend = store.backend()
    limiters = [RateLimiter(hostile, backend) for hostile in HOSTILE_NAMES]
    for i, limiter in enumerate(limiters):
        assert await limiter.try_set_rate(RateLimiterConfig.build(OVERALL, i + 2, 60))
    for i, limiter in enumerate(limiters):
        assert await limiter.try_acquire(i + 1)
    for i, limiter in enumerate(limiters):
        assert (await limiter.get_config()).rate == i + 2, limiter.name
        assert await limiter.available_permits() == 1, limiter.name
    assert await limiters[0].delete()
    for limiter in limiters[1:]:
        assert await limiter.available_permits() == 1, limiter.name
    assert await limiters[0].get_config() is None


async def test_hostile_client_ids_keep_separate_per_client_budgets(store, name):
    ids = ["{x}", "}{", "x", "x:y", "ü 🚦", "%7Bx%7D"]
    limiters = [RateLimiter(name, new_client(store, client_id)) for client_id in ids]
    await limiters[0].set_rate(RateLimiterConfig.build(PER_CLIENT, len(ids), 60))
    for i, limiter in enumerate(limiters):
        assert await limiter.try_acquire(i + 1)
    for i, limiter in enumerate(limiters):
        assert await limiter.available_permits() == len(ids) - i - 1
    assert await limiters[0].delete()
    await assert_stored_keys(store, 0)


# -- errors -------------------------------------------------------------------------------------


async def test_an_unconfigured_limiter_raises_not_configured(store, name):
    limiter = RateLimiter(name, store.backend())
    start = now()
    for call in (
        limiter.acquire,
        limiter.try_acquire,
        lambda: limiter.try_acquire(timeout=5),
        lambda: limiter.try_acquire(timeout=None),
        limiter.available_permits,
    ):
        with pytest.raises(NotConfiguredError) as caught:
            await call()
        assert isinstance(caught.value, LimiterError)
    tolerance(store).check(now(), start, "the errors (waited for a limiter that has no rate)")
    assert issubclass(aiolimit.BackendError, LimiterError)
    with pytest.raises(NotConfiguredError):
        async with limiter:
            pass


BAD_RATES = [0, -1, 1.5, 2.0, True, "3", None, math.inf]
BAD_INTERVALS = [0, -1, timedelta(0), timedelta(seconds=-1), "1", None, math.nan, math.inf]
BAD_PERMITS = [0, -1, 1.5, 1.0, True, False, "1", None]
BAD_TIMEOUTS = [-1, -0.001, timedelta(seconds=-1), "1", math.nan]


def assert_invalid(caught: pytest.ExceptionInfo) -> None:
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, LimiterError)
    assert type(caught.value).__module__.startswith("aiolimit")


@pytest.mark.filterwarnings("ignore:.*rate_type, rate:DeprecationWarning")  # still checked
async def test_invalid_rate_arguments_raise_value_errors_and_write_nothing(store, name):
    limiter = RateLimiter(name, store.backend())
    setters = (limiter.try_set_rate, limiter.set_rate, limiter.update_rate)
    for setter in setters:
        for rate in BAD_RATES:
            with pytest.raises(InvalidArgumentError) as caught:
                await setter(OVERALL, rate, 1)
            assert_invalid(caught)
        for interval in BAD_INTERVALS:
            with pytest.raises(InvalidArgumentError) as caught:
                await setter(OVERALL, 1, interval)
            assert_invalid(caught)
        with pytest.raises(InvalidArgumentError) as caught:
            await setter(OVERALL, 1, 2, keep_alive=1.999)
        assert_invalid(caught)
        with pytest.raises(InvalidArgumentError) as caught:
            await setter("SOMETIMES", 1, 2)
        assert_invalid(caught)
    assert await limiter.get_config() is None
    await assert_stored_keys(store, 0)


async def test_invalid_permits_and_timeouts_raise_value_errors_and_take_nothing(store, name):
    limiter = await configured(store, name, 3, 10)
    for permits in BAD_PERMITS:
        for call in (
            lambda: limiter.try_acquire(permits),  # noqa: B023 - called at once
            lambda: limiter.acquire(permits),  # noqa: B023
            lambda: limiter.release(permits),  # noqa: B023
        ):
            with pytest.raises(InvalidArgumentError) as caught:
                await call()
            assert_invalid(caught)
    for timeout in BAD_TIMEOUTS:
        with pytest.raises(InvalidArgumentError) as caught:
            await limiter.try_acquire(1, timeout=timeout)
        assert_invalid(caught)
    for ttl in (0, -1, timedelta(0)):
        with pytest.raises(InvalidArgumentError) as caught:
            await limiter.expire(ttl)
        assert_invalid(caught)
    assert await limiter.available_permits() == 3


async def test_permits_above_the_rate_raise_value_errors_however_they_are_asked(store, name):
    limiter = await configured(store, name, 3, 10)
    for call in (
        lambda: limiter.try_acquire(4),
        lambda: limiter.try_acquire(4, timeout=1),
        lambda: limiter.try_acquire(4, timeout=None),
        lambda: limiter.acquire(4),
    ):
        with pytest.raises(InvalidArgumentError, match="exceed") as caught:
            await call()
        assert_invalid(caught)
    assert await limiter.available_permits() == 3


async def test_permits_above_the_rate_raise_even_while_others_wait(store, name, asleep):
    limiter = await configured(store, name, 2, 10)
    assert await limiter.try_acquire(2)
    waiter = asyncio.create_task(limiter.acquire())
    await asleep.reach(name, 1)
    try:
        with pytest.raises(InvalidArgumentError):
            await limiter.try_acquire(3)
        with pytest.raises(InvalidArgumentError):
            await asyncio.wait_for(limiter.acquire(3), 1)
    finally:
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)


async def test_empty_or_non_string_names_are_rejected(store, name):
    backend = store.backend()
    for bad in ("", None, 3, b"name"):
        with pytest.raises(InvalidArgumentError) as caught:
            RateLimiter(bad, backend)
        assert_invalid(caught)


# -- the sliding window -------------------------------------------------------------------------


async def test_a_request_stamped_before_the_latest_one_acts_at_the_latest_time(store, name):
    # Clients that stamp their own times (clock='client') can reach the server out of order.
    # A request stamped earlier than one the limiter already acted on must not act in the
    # past, where the grants the newer request reclaimed still filled the window.
    times = {"a": 0.0, "b": 0.0}
    a = RateLimiter(name, new_client(store, "a", clock=lambda: times["a"]))
    b = RateLimiter(name, new_client(store, "b", clock=lambda: times["b"]))
    await a.set_rate(RateLimiterConfig.build(OVERALL, 2, 10))
    assert await a.try_acquire(2)  # both permits at t=0
    times["b"] = 10.5  # the t=0 grants have left the window
    assert await b.try_acquire(1)
    times["a"] = 9.9  # stamped before b's request, arriving after it
    assert await a.try_acquire(1)  # acts at t=10.5: the window (0.5, 10.5] holds 2
    assert not await a.try_acquire(1)
    attempt = await a.backend.try_acquire(name, 1)
    assert isinstance(attempt, Refusal)
    assert attempt.at == 10_500_000  # decided at the latest time, not at 9.9 s


@pytest.mark.slow
async def test_mixed_requests_from_many_clients_never_overfill_a_window(store, name):
    rate, interval = 8, 0.2
    clock = AttemptClock(tolerance(store))
    await RateLimiter(name, store.backend()).set_rate(
        RateLimiterConfig.build(OVERALL, rate, interval)
    )
    limiters = [RateLimiter(name, new_client(store, clock=clock)) for _ in range(2)]
    grants: list[tuple[float, float]] = []

    async def worker(i: int) -> None:
        limiter = limiters[i % 2]
        for step in range(3):
            permits = 1 + (i + step) % 3
            grants.extend(per_permit(await clock.take(limiter, permits), permits))

    await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(4))), 10)
    assert len(grants) == sum(1 + (i + s) % 3 for i in range(4) for s in range(3))
    assert_sliding_window(grants, rate, interval)


# -- asking without taking, several permits, warnings, shutdown ----------------------------------


@pytest.mark.slow
async def test_wait_time_says_when_permits_free_and_takes_nothing(store, name):
    limiter = await configured(store, name, 3, 0.5)
    assert await limiter.wait_time() == 0
    first = await take(limiter, 2)
    await asyncio.sleep(0.1)
    second = await take(limiter)
    tol = tolerance(store)
    # One permit is free when the first grant leaves the window; two only when both have.
    tol.check_span(
        await when_free(limiter, 1), (first[0] + 0.5, first[1] + 0.5), "the first free permit"
    )
    tol.check_span(
        await when_free(limiter, 3), (second[0] + 0.5, second[1] + 0.5), "three free permits"
    )
    assert await limiter.available_permits() == 0, "wait_time took a permit"
    await asyncio.sleep(await limiter.wait_time(1))
    assert await limiter.try_acquire(timeout=tol.late)
    with pytest.raises(InvalidArgumentError):
        await limiter.wait_time(4)
    with pytest.raises(NotConfiguredError):
        await RateLimiter(f"{name}-none", store.backend()).wait_time()


async def test_async_with_permits_takes_that_many(store, name):
    limiter = await configured(store, name, 5, 10)
    async with limiter.permits(3):
        assert await limiter.available_permits() == 2
    async with limiter:
        assert await limiter.available_permits() == 1
    with pytest.raises(InvalidArgumentError):
        limiter.permits(0)


async def test_try_set_rate_warns_once_when_another_config_is_stored(store, name, caplog):
    limiter = RateLimiter(name, store.backend())
    assert await limiter.try_set_rate(RateLimiterConfig.build(OVERALL, 5, 1))
    with caplog.at_level("WARNING", logger="aiolimit"):
        assert not await limiter.try_set_rate(
            RateLimiterConfig.build(OVERALL, 5, 1)
        )  # the same config: nothing to say
        assert not caplog.records
        for _ in range(3):
            assert not await limiter.try_set_rate(RateLimiterConfig.build(OVERALL, 7, 1))
    assert len(caplog.records) == 1, "warned more than once"
    assert "'5/second'" in caplog.text and "'7/second'" in caplog.text
    assert (await limiter.get_config()).rate == 5  # the stored config stays


async def test_aclose_waits_for_the_hand_backs_of_cancelled_callers(store, name, asleep):
    backend = store.backend()
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 1, 10))
    first = await take(limiter)
    waiters = [asyncio.create_task(limiter.acquire()) for _ in range(3)]
    await asleep.reach(name, 3)  # all three hold reservations
    for waiter in waiters:
        waiter.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    await backend.aclose()
    # Every reservation was handed back: the next request waits for the first grant only.
    # (Asked through another client, which shares no queue of calls with this one.)
    other = RateLimiter(name, new_client(store))
    tolerance(store).check_span(
        await when_free(other), (first[0] + 10, first[1] + 10), "the first free slot"
    )
