"""``set_rate(..., keep_state=True)`` to a longer interval: the grants
still inside the new window keep counting, for OVERALL and PER_CLIENT alike, on every backend
of the conformance suite and every algorithm.

The limiter's clock is one the test moves (``manual_clock``: it starts at a whole hour, the
start of every window used here), and ``advance`` ages Redis's keys with it, so that they
expire when they would in real time, as the memory backend's do: nothing here depends on
timing. Where an algorithm keeps no grant by design (a token bucket keeps its level), the
test states what it does admit.
"""

from __future__ import annotations

import re

import pytest
from conformance import (
    ManualClock,
    advance,
    manual_clock,
    new_client,
    reservations,
)

from aiolimit import Algorithm, Rate, RateLimiter, RateLimiterConfig, RateType, RedisBackend
from aiolimit.backends._protocol import HELD_BUCKETS
from tools import busiest_window

ALGORITHMS = pytest.mark.parametrize("algorithm", list(Algorithm), ids=lambda a: a.name.lower())
RATE_TYPES = pytest.mark.parametrize("rate_type", list(RateType), ids=lambda t: t.name.lower())


SLIDING, BUCKET, FIXED = Algorithm.SLIDING_WINDOW, Algorithm.TOKEN_BUCKET, Algorithm.FIXED_WINDOW
OVERALL, PER_CLIENT = RateType.OVERALL, RateType.PER_CLIENT
START = round(ManualClock.START * 1e6)


async def _granted(limiter: RateLimiter, tries: int) -> int:
    return sum([await limiter.try_acquire() for _ in range(tries)])


async def _windows_then_longer(store, clock, limiter, rate_type, grants, release_in=None) -> int:
    # A fixed window of 100 s (rate 3) per entry of `grants`, each granted that many at its
    # start (and, in window `release_in`, one handed back); at 50 s into the last, switched
    # to 10 per 1000 s keeping the state: how many the new window [0, 1000 s) still grants.
    await limiter.set_rate(RateLimiterConfig.build(rate_type, [Rate(3, 100)], algorithm=FIXED))
    for i, count in enumerate(grants):
        if i:
            await advance(store, clock, 100)
        assert await _granted(limiter, count) == count
        if i == release_in:
            await limiter.release(1)
    await advance(store, clock, 50)
    await limiter.set_rate(
        RateLimiterConfig.build(rate_type, [Rate(10, 1000)], algorithm=FIXED), keep_state=True
    )
    return await _granted(limiter, 10)


@ALGORITHMS
@RATE_TYPES
@pytest.mark.parametrize(
    ("interval", "after", "longer"), [(1, 1.5, 10), (100, 150, 1000)], ids=["seconds", "long"]
)
async def test_a_switch_to_a_longer_interval_after_the_old_one_keeps_its_grants(
    store, name, algorithm, rate_type, interval, after, longer
):
    # ("seconds"): 10 grants under 10 per 1 s; 1.5 s later
    # (past the old window; Redis's keys age with the clock) the rate becomes 10 per 10 s,
    # keeping the state. The windows still count the 10 grants: nothing more is admitted
    # until they leave the new window. A token bucket was full again (its 10 tokens came back
    # within the old interval) and grants its full rate at once, as any full bucket does.
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(
        RateLimiterConfig.build(rate_type, [Rate(10, interval)], algorithm=algorithm)
    )
    assert await _granted(limiter, 10) == 10
    await advance(store, clock, after)
    await limiter.set_rate(
        RateLimiterConfig.build(rate_type, [Rate(10, longer)], algorithm=algorithm), keep_state=True
    )
    assert await _granted(limiter, 10) == (10 if algorithm is BUCKET else 0)


@pytest.mark.parametrize("algorithm", [SLIDING, FIXED], ids=lambda a: a.name.lower())
@pytest.mark.parametrize(("after", "granted"), [(199, 0), (200, 10)])
@RATE_TYPES
async def test_the_state_is_kept_for_two_intervals_after_its_newest_grant(
    store, name, algorithm, rate_type, after, granted
):
    # The horizon: a budget's state (its summary included) lives HELD_BUCKETS intervals after
    # its newest grant (a fixed window's: after its window's end, here 100 s later), then is
    # forgotten: a switch to a longer interval later than that starts afresh.
    after += 100 if algorithm is FIXED else 0
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(rate_type, [Rate(10, 100)], algorithm=algorithm))
    assert await _granted(limiter, 10) == 10
    await advance(store, clock, after)
    await limiter.set_rate(
        RateLimiterConfig.build(rate_type, [Rate(10, 1000)], algorithm=algorithm), keep_state=True
    )
    assert await _granted(limiter, 10) == granted


# What each algorithm admits in test_a_longer_interval_with_keep_state_counts_grants_already_
# reclaimed: right after the change, at 999 s, at 1000 s.
AFTER_RECLAIMED = {
    # 11 grants in the new window; those of 0 leave it at 1000 s, not before.
    SLIDING: (0, 0, 8),
    # 11 grants in the new window [0, 1000 s); at 1000 s a new window starts.
    FIXED: (0, 0, 10),
    # 1 token missing at 150 s (10 s at 10 per 100 s) takes 100 s at 10 per 1000 s: the
    # bucket holds 9; at 999 s it has refilled 8 of the 9 taken; at 1000 s not one more.
    BUCKET: (9, 8, 0),
}


@ALGORITHMS
@RATE_TYPES
async def test_a_longer_interval_with_keep_state_counts_grants_already_reclaimed(
    store, name, algorithm, rate_type
):
    # 9 grants under 10 per 100 s at 0 and one at 99 s (so the state lives on past 100 s);
    # at 150 s one more, which reclaims the 9 of 0 from the log (a fixed window: starts a new
    # window) under the old rate; then the rate becomes 10 per 1000 s.
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(rate_type, [Rate(10, 100)], algorithm=algorithm))
    assert await _granted(limiter, 9) == 9
    await advance(store, clock, 99)
    assert await limiter.try_acquire()
    await advance(store, clock, 51)
    assert await limiter.try_acquire()
    await limiter.set_rate(
        RateLimiterConfig.build(rate_type, [Rate(10, 1000)], algorithm=algorithm), keep_state=True
    )
    now, before_end, at_end = AFTER_RECLAIMED[algorithm]
    assert await _granted(limiter, 10) == now
    await advance(store, clock, 849)
    assert await _granted(limiter, 10) == before_end
    await advance(store, clock, 1)
    assert await _granted(limiter, 10) == at_end


@ALGORITHMS
@RATE_TYPES
async def test_a_longer_interval_with_keep_state_keeps_grants_inside_the_old_window(
    store, name, algorithm, rate_type
):
    # 6 grants under 10 per 100 s at 0; at 5 s the rate becomes 10 per 1000 s: 4 more, no
    # more (a token bucket misses 5.5 tokens at 5 s; at the new rate they refill in 550 s).
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(rate_type, [Rate(10, 100)], algorithm=algorithm))
    assert await _granted(limiter, 6) == 6
    await advance(store, clock, 5)
    await limiter.set_rate(
        RateLimiterConfig.build(rate_type, [Rate(10, 1000)], algorithm=algorithm), keep_state=True
    )
    assert await _granted(limiter, 10) == 4


@RATE_TYPES
async def test_a_full_bucket_switched_to_a_longer_interval_grants_its_full_rate(
    store, name, rate_type
):
    # A bucket's state is its level: a token back in the bucket is no grant any more. Full at
    # 100 s, switched at 150 s to 10 per 1000 s: 10 at once, then one per 100 s.
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(rate_type, [Rate(10, 100)], algorithm=BUCKET))
    assert await _granted(limiter, 10) == 10
    await advance(store, clock, 150)
    await limiter.set_rate(
        RateLimiterConfig.build(rate_type, [Rate(10, 1000)], algorithm=BUCKET), keep_state=True
    )
    assert await _granted(limiter, 11) == 10
    await advance(store, clock, 99.999)
    assert await _granted(limiter, 1) == 0
    await advance(store, clock, 0.001)
    assert await _granted(limiter, 2) == 1


@RATE_TYPES
async def test_a_bucket_converts_its_missing_tokens_through_successive_changes(
    store, name, rate_type
):
    # Each change converts the tokens missing at that moment to the new rate, an OVERALL
    # bucket at the change, a PER_CLIENT client's at its next call (from the change's time):
    # both admit the same. 8 of 10 per 100 s at 0 (8 missing, 80 s); at 20 s, 6 missing
    # become 10 per 200 s (120 s); at 40 s, 5 missing (100 s) become 5 per 100 s (100 s).
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(rate_type, [Rate(10, 100)], algorithm=BUCKET))
    assert await _granted(limiter, 8) == 8
    await advance(store, clock, 20)
    await limiter.set_rate(
        RateLimiterConfig.build(rate_type, [Rate(10, 200)], algorithm=BUCKET), keep_state=True
    )
    await advance(store, clock, 20)
    await limiter.set_rate(
        RateLimiterConfig.build(rate_type, [Rate(5, 100)], algorithm=BUCKET), keep_state=True
    )
    await advance(store, clock, 40)  # 5 missing at 40 s, one back per 20 s: 3 at 80 s
    assert await _granted(limiter, 5) == 2


@RATE_TYPES
async def test_a_bucket_switched_to_a_slower_rate_keeps_what_it_owes_until_it_is_paid(
    store, name, rate_type
):
    # 10 per 100 s, emptied at 0, switched at once to 2 per 100 s keeping the state: the 10
    # missing tokens come back at the new rate, one per 50 s, so the bucket is full at 500 s
    # and has a token again at 450 s. A PER_CLIENT client's state kept the old rate's TTL
    # (its bucket full at 100 s) and was gone at 150 s: a full bucket of 2. (150 other
    # clients: their TTLs are given in chunks after the change, on Redis.)
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(rate_type, [Rate(10, 100)], algorithm=BUCKET))
    if rate_type is PER_CLIENT:
        for i in range(150):
            assert await limiter.for_client(f"other-{i}").try_acquire()
    assert await _granted(limiter, 10) == 10
    await limiter.set_rate(
        RateLimiterConfig.build(rate_type, [Rate(2, 100)], algorithm=BUCKET), keep_state=True
    )
    seen = []
    for at in (50, 150, 300, 449.999, 450, 500):
        await advance(store, clock, at - (seen[-1][0] if seen else 0))
        seen.append((at, await limiter.available_permits()))
    assert seen == [(50, 0), (150, 0), (300, 0), (449.999, 0), (450, 1), (500, 2)]


@RATE_TYPES
async def test_fixed_windows_keep_a_bounded_summary_of_their_earlier_windows(
    store, name, rate_type
):
    # One grant in each window of 100 s from 0 to 300 s: the state keeps the latest window and
    # HELD_BUCKETS before it (100-200 s and 200-300 s), not the window of 0. Switched to 10
    # per 1000 s at 350 s, the new window [0, 1000 s) counts 3 of the 4 grants.
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    granted = await _windows_then_longer(store, clock, limiter, rate_type, [1, 1, 1, 1])
    assert granted == 10 - 1 - HELD_BUCKETS


@RATE_TYPES
async def test_fixed_windows_keep_the_latest_earlier_windows_each_with_its_own_count(
    store, name, rate_type
):
    # 1, 2 and 3 grants in the windows of 0, 100 and 200 s, then 1 at 300 s, each new window
    # begun by a grant at once: the summary keeps the latest HELD_BUCKETS windows left behind
    # (2 and 3 grants), not the oldest. Switched to 10 per 1000 s at 350 s, the new window
    # [0, 1000 s) counts 1 + 3 + 2 = 6 of the 7 grants (keeping the oldest would count 5).
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    assert await _windows_then_longer(store, clock, limiter, rate_type, [1, 2, 3, 1]) == 10 - 6


@RATE_TYPES
async def test_a_window_whose_grants_were_all_handed_back_is_not_kept(store, name, rate_type):
    # 1 and 2 grants in the windows of 0 and 100 s; at 200 s a grant handed back; 1 grant at
    # 300 s. The window of 200 s holds nothing, so the summary keeps the two before it, each
    # moved on to the new latest window: switched to 10 per 1000 s at 350 s, [0, 1000 s)
    # counts 1 + 2 + 1 = 4.
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    granted = await _windows_then_longer(store, clock, limiter, rate_type, [1, 2, 1, 1], 2)
    assert granted == 10 - 4


@RATE_TYPES
async def test_several_rates_switched_to_one_count_the_first_rates_earlier_windows(
    store, name, rate_type
):
    # Under 100 per 10 s and 100 per 1 s, 3 grants at 20.5 s and 3 at 49.9 s: the summary
    # keeps the 10 s window that ended at 30 s and, last, the 1 s window that ended at 21 s.
    # Switched to 6 per 25 s, the window [25 s, 50 s) holds both grants of 10 s windows
    # (those ending at 30 and 50 s): 6, so none more. (The 1 s rate's entry says nothing
    # about the first rate's: it must not stand in for them.)
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(
        RateLimiterConfig.build(rate_type, [Rate(100, 10), Rate(100, 1)], algorithm=FIXED)
    )
    await advance(store, clock, 20.5)
    assert await _granted(limiter, 3) == 3
    await advance(store, clock, 29.4)
    assert await _granted(limiter, 3) == 3
    await limiter.set_rate(
        RateLimiterConfig.build(rate_type, [Rate(6, 25)], algorithm=FIXED), keep_state=True
    )
    assert await _granted(limiter, 6) == 0


@RATE_TYPES
async def test_a_sliding_window_keeps_a_bounded_summary_of_what_it_reclaimed(
    store, name, rate_type
):
    # A grant every 60 s under 2 per 100 s, from 0 to 420 s: each from 120 s reclaims the one
    # of 120 s before. The log keeps their permits in at most HELD_BUCKETS spans of 100 s (its
    # value key stays small): at 420 s, 1 of span 200-300 s and 1 of 300-400 s; those of 0,
    # 60, 120 and 180 s are forgotten. A longer interval counts the spans it covers.
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(rate_type, [Rate(2, 100)], algorithm=SLIDING))
    for i in range(8):
        if i:
            await advance(store, clock, 60)
        assert await limiter.try_acquire()
    held = await _held(store, backend, name)
    assert held == [[1, START + 240_000_000], [1, START + 300_000_000]]
    assert len(held) == HELD_BUCKETS
    await limiter.set_rate(
        RateLimiterConfig.build(rate_type, [Rate(12, 1000)], algorithm=SLIDING), keep_state=True
    )
    assert await _granted(limiter, 12) == 8  # 2 logged and 2 held count


async def _held(store, backend, name: str) -> list[list[int]]:
    """The held entries of the limiter's one budget (OVERALL or the default client's)."""
    if isinstance(backend, RedisBackend):
        values = [k for k in await backend.redis.keys("*") if b":value" in k]
        assert len(values) == 1, values
        value = (await backend.redis.get(values[0])).decode()
        return [[int(p), int(at)] for p, at in re.findall(r" ~(\d+):(-?\d+)", value)]
    limiter = backend._shared.limiters[name]
    (budget,) = limiter.budgets.values()
    return budget.held


# -- a reset keeps what was promised ----------------------------------------------------------


@ALGORITHMS
@pytest.mark.parametrize("to", list(Algorithm), ids=lambda a: a.name.lower())
async def test_a_reset_counts_the_reservations_it_finds_against_the_new_state(
    store, name, algorithm, to
):
    # set_rate 20/s -> 5/s with 20 reservations queued: 25 grants started within one second
    # of the change; sliding window -> token bucket at 20/s: 40. The queued ones keep their
    # slots, and no second after the change holds more than the larger rate allows.
    clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, [Rate(20, 1)], algorithm=algorithm))
    await reservations(backend, name, 20)
    queued = await reservations(backend, name, 20)
    assert all(grant.starts_in > 0 for grant in queued)
    changed_at = round(clock() * 1e6)
    for rate in (5, 20):
        await limiter.set_rate(
            RateLimiterConfig.build(OVERALL, [Rate(rate, 1)], algorithm=to), keep_state=False
        )
        starts = [grant.starts_at for grant in queued]
        starts += [grant.starts_at for grant in await reservations(backend, name, 30)]
        largest = 20 if to is not BUCKET else 39  # (a bucket: rate + rate * w / interval)
        most = busiest_window([s for s in starts if s >= changed_at], 1_000_000).most
        assert most <= largest, f"{most} grants start within one second of the change"
        assert min(starts) == queued[0].starts_at  # (nothing was moved)
        await limiter.delete()
        await limiter.set_rate(RateLimiterConfig.build(OVERALL, [Rate(20, 1)], algorithm=algorithm))
        await reservations(backend, name, 20)
        queued = await reservations(backend, name, 20)
        changed_at = round(clock() * 1e6)


@ALGORITHMS
async def test_a_reset_with_nothing_queued_forgets_what_was_used(store, name, algorithm):
    _clock, backend = manual_clock(store)
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, [Rate(20, 1)], algorithm=algorithm))
    await reservations(backend, name, 20)
    await limiter.set_rate(
        RateLimiterConfig.build(OVERALL, [Rate(5, 1)], algorithm=algorithm), keep_state=False
    )
    assert await limiter.available_permits() == 5


@ALGORITHMS
@pytest.mark.parametrize("to", list(Algorithm), ids=lambda a: a.name.lower())
async def test_a_reset_counts_each_clients_reservations_against_its_new_budget(
    store, name, algorithm, to
):
    # PER_CLIENT: a reset is O(1) in the clients, so each client's queued reservations are
    # found when the reset's clean-up or the client's next request reaches it, whichever is
    # first. A client that had nothing queued starts with its whole new budget.
    clock, waiting = manual_clock(store)
    idle = new_client(store, "idle", clock=clock)
    limiter = RateLimiter(name, waiting)
    await limiter.set_rate(RateLimiterConfig.build(PER_CLIENT, [Rate(20, 1)], algorithm=algorithm))
    await reservations(idle, name, 20)
    await reservations(waiting, name, 20)
    queued = await reservations(waiting, name, 20)
    assert all(grant.starts_in > 0 for grant in queued)
    changed_at = round(clock() * 1e6)
    await limiter.set_rate(
        RateLimiterConfig.build(PER_CLIENT, [Rate(5, 1)], algorithm=to), keep_state=False
    )
    starts = [grant.starts_at for grant in queued]
    starts += [grant.starts_at for grant in await reservations(waiting, name, 30)]
    largest = 20 if to is not BUCKET else 39  # (a bucket: rate + rate * w / interval)
    most = busiest_window([s for s in starts if s >= changed_at], 1_000_000).most
    assert most <= largest, f"{most} grants start within one second of the change"
    assert await RateLimiter(name, idle).available_permits() == 5


@pytest.mark.parametrize("store", ["redis", "valkey"], indirect=True)
async def test_a_client_the_resets_clean_up_has_not_reached_keeps_its_reservations(
    store, name, monkeypatch
):
    # The clean-up visits the clients in chunks after the reset; a client's request that
    # comes first (or a reset whose process stopped before cleaning up) finds its queued
    # reservations by itself.
    clock, waiting = manual_clock(store)
    limiter = RateLimiter(name, waiting)
    await limiter.set_rate(RateLimiterConfig.build(PER_CLIENT, [Rate(20, 1)], algorithm=SLIDING))
    await reservations(waiting, name, 20)
    queued = await reservations(waiting, name, 20)

    async def stopped(*args: object) -> None:
        pass

    monkeypatch.setattr("aiolimit.backends.redis.retire_clients", stopped)
    await limiter.set_rate(RateLimiterConfig.build(PER_CLIENT, [Rate(5, 1)], algorithm=FIXED))
    [first] = await reservations(waiting, name, 1)
    assert first.starts_at >= queued[-1].starts_at + 1_000_000  # the window after theirs
    assert await RateLimiter(name, new_client(store, "idle", clock=clock)).available_permits() == 5
