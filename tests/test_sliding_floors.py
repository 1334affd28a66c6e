"""A provider's count on a sliding window (``Backend.sync``): a floor on the log that holds
until the provider's reset, though the grants before it leave the window, while every grant
stays settleable. On every backend, on a clock the test moves."""

from __future__ import annotations

from typing import Any

from conformance import ManualClock, advance
from settling import NAME, RATE_TYPES, SLIDING, limiter, take

from aiolimit import RateType
from aiolimit.backends import Backend, Grant, RedisBackend


async def _granted(store: Any, clock: ManualClock, backend: Backend, seconds: int) -> int:
    """Takes every permit free, once a second for ``seconds`` seconds; how many."""
    granted = 0
    for _ in range(seconds):
        while isinstance(await backend.try_acquire(NAME, 1, 0), Grant):
            granted += 1
        await advance(store, clock, 1)
    return granted


@RATE_TYPES
async def test_a_grant_after_the_sync_settled_for_less_hands_back_to_the_floor_too(
    store: Any, rate_type: RateType
) -> None:
    # 10 per minute; the provider says 3 are left until 30 s; 3 reserved at 1 s, settled for 1:
    # the provider hands back 2 on completion, and so does the limiter, at once.
    clock, backend = await limiter(store, SLIDING, rate_type)
    await backend.sync(NAME, 3, 30_000_000)
    await advance(store, clock, 1)
    grant = await take(backend, 3)
    assert await backend.available_permits(NAME) == 0
    settled = await backend.settle(NAME, grant.member, 1)
    assert settled.handed_back == 2
    assert await backend.available_permits(NAME) == 2
    assert await backend.release(NAME, 1, settled.member) == 1
    assert await backend.available_permits(NAME) == 3


async def test_a_hand_back_frees_what_it_took_and_the_provider_s_other_calls_hold(
    store: Any,
) -> None:
    # 6 at 0; at 10 s the provider says 2 are left until 40 s: it counts 2 calls besides
    # the log's 6. The 6 released (the call was not sent, or used nothing) free 6; the 2
    # hold until 40 s.
    clock, backend = await limiter(store, SLIDING)
    grant = await take(backend, 6)
    await advance(store, clock, 10)
    await backend.sync(NAME, 2, 30_000_000)
    assert await backend.available_permits(NAME) == 2
    assert await backend.release(NAME, 6, grant.member) == 6
    assert await backend.available_permits(NAME) == 8
    await advance(store, clock, 29.9)
    assert await backend.available_permits(NAME) == 8
    await advance(store, clock, 0.1)
    assert await backend.available_permits(NAME) == 10


async def test_a_provider_that_holds_the_grants_longer_holds_them_in_the_log(
    store: Any,
) -> None:
    # 10 at 0 of 10 per minute; at 50 s the provider says none are left until 75 s: it saw
    # them late, or its window is longer. They leave the log's window at 75 s, not 60 s.
    clock, backend = await limiter(store, SLIDING)
    await take(backend, 10)
    await advance(store, clock, 50)
    await backend.sync(NAME, 0, 25_000_000)
    assert await _granted(store, clock, backend, 25) == 0
    assert await backend.available_permits(NAME) == 10


async def test_a_floor_on_an_empty_log_holds_until_the_reset_then_goes(store: Any) -> None:
    clock, backend = await limiter(store, SLIDING)
    await backend.sync(NAME, 0, 20_000_000)
    await advance(store, clock, 19.9)
    assert await backend.available_permits(NAME) == 0
    assert not isinstance(await backend.try_acquire(NAME, 1, 0), Grant)
    waited = await backend.try_acquire(NAME, 1, 1_000_000)  # the wait ends at the reset
    assert isinstance(waited, Grant) and waited.starts_in == 100_000


async def test_every_permit_granted_within_the_reset_counts_in_the_floor(store: Any) -> None:
    # Without the floor counting them, grants made after the sync would be free again when
    # the older grants left the window: 4 at 0, at 50 s "2 left until 80 s", 2 granted at
    # 55 s; the grants of 0 leave at 60 s, and still nothing more goes until 80 s.
    clock, backend = await limiter(store, SLIDING)
    await take(backend, 4)
    await advance(store, clock, 50)
    await backend.sync(NAME, 2, 30_000_000)
    await advance(store, clock, 5)
    await take(backend, 2)
    await advance(store, clock, 5)
    assert await backend.available_permits(NAME) == 0
    assert await _granted(store, clock, backend, 19) == 0
    await advance(store, clock, 1)
    assert await backend.available_permits(NAME) == 8


async def test_many_syncs_keep_a_bounded_state_and_the_latest_count(store: Any) -> None:
    # The last count says 4 left: 6 counted, 5 beyond the log's 1.
    clock, backend = await limiter(store, SLIDING)
    await take(backend, 1)
    for i in range(1_000):
        await backend.sync(NAME, 9 - i % 7, 1_000_000 * (1 + i % 13))
        if i % 100 == 0:
            await advance(store, clock, 0.01)
    assert await backend.available_permits(NAME) == 4
    if isinstance(backend, RedisBackend):
        value = await backend.redis.get(backend.keys(NAME).value)
        assert value.count(b" ~f") <= 2, value
        assert value.count(b" ~x") <= 1, value
        assert await backend.redis.zcard(backend.keys(NAME).permits) <= 2


async def test_a_later_count_replaces_what_an_earlier_one_counted_beyond_the_grants(
    store: Any,
) -> None:
    # 2 granted. "5 left": the provider counts 3 calls beyond them. A second later "7 left":
    # it counts 1 (an earlier count had not seen calls complete, or a call of another client
    # left its window); then "10 left": none. The log's own 2 still count.
    clock, backend = await limiter(store, SLIDING)
    await take(backend, 2)
    await backend.sync(NAME, 5, 30_000_000)
    assert await backend.available_permits(NAME) == 5
    await advance(store, clock, 1)
    await backend.sync(NAME, 7, 30_000_000)
    assert await backend.available_permits(NAME) == 7
    await backend.sync(NAME, 10, 30_000_000)
    assert await backend.available_permits(NAME) == 8
    await backend.sync(NAME, 9, 30_000_000)  # (counts no more than the log's own)
    assert await backend.available_permits(NAME) == 8


async def test_a_later_count_keeps_the_grants_made_since_the_earlier_one(store: Any) -> None:
    # "6 left": 4 beyond the log's 0; 3 granted; "3 left" counts those 3 and the 4: the
    # provider's 4 and the log's 3 hold, and 3 are free.
    clock, backend = await limiter(store, SLIDING)
    await backend.sync(NAME, 6, 30_000_000)
    await advance(store, clock, 1)
    await take(backend, 3)
    await backend.sync(NAME, 3, 30_000_000)
    assert await backend.available_permits(NAME) == 3
    await advance(store, clock, 30)  # the count's reset, at 31 s: the log's 3 hold to 61 s
    assert await backend.available_permits(NAME) == 7


async def test_a_hostile_reset_counts_for_one_interval_at_most(store: Any) -> None:
    clock, backend = await limiter(store, SLIDING)
    await backend.sync(NAME, 0, 315_360_000_000_000)
    assert await backend.available_permits(NAME) == 0
    await advance(store, clock, 60)
    assert await backend.available_permits(NAME) == 10
