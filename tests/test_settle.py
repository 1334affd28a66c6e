"""Settle and sync (``Backend.settle``, ``Backend.sync``): a grant counted anew once its call's
real cost is known, and a provider's own count taken as a floor, on every backend, algorithm
and rate type, on a clock the test moves."""

from __future__ import annotations

import math
from typing import Any

import pytest
from conformance import ManualClock, advance, new_client
from settling import (
    ALGORITHMS,
    BUCKET,
    FIXED,
    NAME,
    OVERALL,
    PER_CLIENT,
    RATE_TYPES,
    SLIDING,
    limiter,
    take,
)

from aiolimit import (
    Algorithm,
    InvalidArgumentError,
    NotConfiguredError,
    RateLimiterConfig,
    RateType,
)
from aiolimit.backends import Backend, Grant, MemoryBackend, RedisBackend, Refusal, Settlement
from aiolimit.backends._protocol import parse_grant


@ALGORITHMS
@RATE_TYPES
async def test_settling_for_fewer_hands_back_the_difference_once(
    store: Any, algorithm: Algorithm, rate_type: RateType
) -> None:
    _, backend = await limiter(store, algorithm, rate_type)
    grant = await take(backend, 6)
    settled = await backend.settle(NAME, grant.member, 2)
    assert (settled.handed_back, settled.charged, settled.cut) == (4, 0, 0)
    assert parse_grant(settled.member)[:2] == (2, grant.starts_at)
    assert await backend.available_permits(NAME) == 8
    # A client library's resend of the same settle changes nothing.
    assert await backend.settle(NAME, grant.member, 2) == Settlement(0, 0, grant.member)
    assert await backend.release(NAME, 6, grant.member) == 0  # the old member is done
    assert await backend.available_permits(NAME) == 8
    # The member from now on hands back what it counts now.
    assert await backend.release(NAME, 2, settled.member) == 2
    assert await backend.available_permits(NAME) == 10


@ALGORITHMS
@RATE_TYPES
async def test_settling_to_zero_hands_back_everything(
    store: Any, algorithm: Algorithm, rate_type: RateType
) -> None:
    _, backend = await limiter(store, algorithm, rate_type)
    grant = await take(backend, 10)
    assert (await backend.settle(NAME, grant.member, 0))[:2] == (10, 0)
    assert await backend.available_permits(NAME) == 10


@ALGORITHMS
async def test_a_grant_that_has_stopped_counting_gives_nothing_back(
    store: Any, algorithm: Algorithm
) -> None:
    clock, backend = await limiter(store, algorithm)
    grant = await take(backend, 5)
    await advance(store, clock, 61)
    settled = await backend.settle(NAME, grant.member, 0)
    assert (settled.handed_back, settled.charged) == (0, 0)
    assert await backend.available_permits(NAME) == 10


async def test_a_token_bucket_gives_back_only_the_tokens_not_yet_refilled(store: Any) -> None:
    clock, backend = await limiter(store, BUCKET)
    grant = await take(backend, 10)
    await advance(store, clock, 30)  # 5 tokens have come back
    assert (await backend.settle(NAME, grant.member, 0)).handed_back == 5
    assert await backend.available_permits(NAME) == 10


async def test_a_token_bucket_gives_nothing_back_while_reservations_wait_behind(
    store: Any,
) -> None:
    _, backend = await limiter(store, BUCKET)
    grant = await take(backend, 8)
    reserved = await take(backend, 4, wait=True)
    assert reserved.starts_in > 0
    assert (await backend.settle(NAME, grant.member, 0)).handed_back == 0
    assert (await backend.wait_time(NAME, 1)) > reserved.starts_in  # its slot is kept


@ALGORITHMS
@RATE_TYPES
async def test_settling_for_more_charges_the_difference_into_debt(
    store: Any, algorithm: Algorithm, rate_type: RateType
) -> None:
    _, backend = await limiter(store, algorithm, rate_type)
    grant = await take(backend, 10)
    settled = await backend.settle(NAME, grant.member, 15)
    assert (settled.handed_back, settled.charged, settled.cut) == (0, 5, 0)
    assert parse_grant(settled.member)[:2] == (15, grant.starts_at)
    assert await backend.available_permits(NAME) == 0
    # Paid off exactly: 5 permits of debt and the one asked for.
    expected = {SLIDING: 60_000_000, BUCKET: 36_000_000, FIXED: 60_000_000}[algorithm]
    assert await backend.wait_time(NAME, 1) == expected
    # Sent again, it charges nothing more.
    assert await backend.settle(NAME, grant.member, 15) == Settlement(0, 0, grant.member)
    assert await backend.wait_time(NAME, 1) == expected
    if rate_type is PER_CLIENT:  # another client's budget owes nothing
        other = new_client(store, "client-b", clock=ManualClock())
        assert await other.available_permits(NAME) == 10


async def test_a_charge_counts_from_the_settle_not_from_the_grant(store: Any) -> None:
    clock, backend = await limiter(store, SLIDING)
    grant = await take(backend, 10)
    await advance(store, clock, 30)
    assert (await backend.settle(NAME, grant.member, 15)).charged == 5
    await advance(store, clock, 30)  # the grant has left the window, the charge has not
    assert await backend.available_permits(NAME) == 5
    await advance(store, clock, 30)
    assert await backend.available_permits(NAME) == 10


# Grants after a charge wait until the debt is paid off, in order; a reservation made before
# keeps its start. The starts of R1 (before the charge), R2 and R3 (after), from the first
# grant, in seconds, and R2's without the charge.
AFTER_CHARGE = {SLIDING: (60, 61, 61, 60), BUCKET: (24, 66, 72, 48), FIXED: (60, 120, 120, 60)}


@ALGORITHMS
async def test_debt_holds_later_grants_back_in_order_and_keeps_reservations(
    store: Any, algorithm: Algorithm
) -> None:
    clock, backend = await limiter(store, algorithm)
    first = await take(backend, 10)
    await advance(store, clock, 1)
    r1 = await take(backend, 4, wait=True)
    assert (await backend.settle(NAME, first.member, 13)).charged == 3
    r2 = await take(backend, 4, wait=True)
    r3 = await take(backend, 1, wait=True)
    starts = tuple((g.starts_at - first.starts_at) / 1e6 for g in (r1, r2, r3))
    assert starts == AFTER_CHARGE[algorithm][:3]
    assert starts[1] > AFTER_CHARGE[algorithm][3]


@ALGORITHMS
async def test_a_charge_past_max_debt_is_cut(store: Any, algorithm: Algorithm) -> None:
    _, backend = await limiter(store, algorithm, max_debt=2)
    grant = await take(backend, 10)
    settled = await backend.settle(NAME, grant.member, 15)
    assert (settled.charged, settled.cut) == (2, 3)
    again = await backend.settle(NAME, settled.member, 20)
    assert again == Settlement(0, 0, settled.member, 8)  # at the limit: nothing more


@ALGORITHMS
async def test_the_default_max_debt_is_one_interval_of_the_smallest_rate(
    store: Any, algorithm: Algorithm
) -> None:
    _, backend = await limiter(store, algorithm, rates="10/minute; 50/hour")
    grant = await take(backend, 10)
    settled = await backend.settle(NAME, grant.member, 10 + 2**53 - 12)
    assert (settled.charged, settled.cut) == (10, 2**53 - 12 - 10)


@ALGORITHMS
async def test_max_debt_zero_charges_nothing_beyond_what_is_free(
    store: Any, algorithm: Algorithm
) -> None:
    _, backend = await limiter(store, algorithm, max_debt=0)
    grant = await take(backend, 6)
    settled = await backend.settle(NAME, grant.member, 12)
    assert (settled.charged, settled.cut) == (4, 2)
    assert await backend.available_permits(NAME) == 0


@ALGORITHMS
async def test_after_a_charge_the_binding_rate_may_change(store: Any, algorithm: Algorithm) -> None:
    clock, backend = await limiter(store, algorithm, rates="10/minute; 12/hour")
    grant = await take(backend, 10)
    assert grant.binding == 0
    assert (await backend.settle(NAME, grant.member, 13)).charged == 3
    await advance(store, clock, 61)  # the minute has recovered, the hour owes one
    refusal = await backend.try_acquire(NAME, 1)
    assert isinstance(refusal, Refusal)
    # (fixed windows hold the hour's debt in the next hour, as a reservation: 0 left now)
    assert (refusal.left, refusal.binding) == (0 if algorithm is FIXED else -1, 1)


async def test_settling_after_the_state_is_gone_hands_back_and_charges_nothing(
    store: Any,
) -> None:
    _, backend = await limiter(store, SLIDING)
    grant = await take(backend, 6)
    if isinstance(backend, RedisBackend):
        await backend.redis.flushall()
    else:
        await backend.delete(NAME)
    with pytest.raises(NotConfiguredError):
        await backend.settle(NAME, grant.member, 0)
    config = RateLimiterConfig.build(OVERALL, "10/minute")
    await backend.set_rate(NAME, config, "set", False)
    assert await backend.settle(NAME, grant.member, 0) == Settlement(0, 0, grant.member)
    assert await backend.available_permits(NAME) == 10
    # The grant's state is gone with its life: the new one owes nothing for it.
    assert await backend.settle(NAME, grant.member, 9) == Settlement(0, 0, grant.member)
    assert await backend.available_permits(NAME) == 10


@ALGORITHMS
@RATE_TYPES
async def test_sync_tightens_until_the_reset_and_never_loosens(
    store: Any, algorithm: Algorithm, rate_type: RateType
) -> None:
    clock, backend = await limiter(store, algorithm, rate_type)
    await backend.sync(NAME, 20, 20_000_000)  # more than it allows: nothing changes
    assert await backend.available_permits(NAME) == 10
    await backend.sync(NAME, 3, 20_000_000)
    granted = 0
    for _ in range(20):  # until the reset, at most 3
        while isinstance(await backend.try_acquire(NAME, 1), Grant):
            granted += 1
        await advance(store, clock, 1)
    assert 0 < granted <= 3
    if algorithm is SLIDING:  # the floor leaves the window at the reset
        assert await backend.available_permits(NAME) == 7
    await advance(store, clock, 60)
    assert await backend.available_permits(NAME) == 10


async def _granted_each_second(
    store: Any, clock: ManualClock, backend: Backend, seconds: int
) -> int:
    """Takes every permit free, once a second for ``seconds`` seconds; how many."""
    granted = 0
    for _ in range(seconds):
        while isinstance(await backend.try_acquire(NAME, 1), Grant):
            granted += 1
        await advance(store, clock, 1)
    return granted


@ALGORITHMS
@RATE_TYPES
@pytest.mark.parametrize(("taken", "remaining"), [(10, 0), (6, 3), (2, 5)])
async def test_sync_holds_until_the_reset_though_the_grants_before_it_leave_the_window(
    store: Any, algorithm: Algorithm, rate_type: RateType, taken: int, remaining: int
) -> None:
    # 10 per minute, `taken` at 0; at 54 s the provider says `remaining` are left until its
    # reset at 84 s. The grants of 0 leave a sliding window at 60 s, and a fixed window
    # starts anew then: 10 more were granted before the provider's reset. What it says is
    # left holds until then, and no less is left now than it says (or the limiter allows):
    # the window and the provider both allow min(remaining, 10 - taken) at once, and fixed
    # windows the rest of `remaining` after their edge (tests/test_sync_edges.py).
    clock, backend = await limiter(store, algorithm, rate_type)
    assert isinstance(await backend.try_acquire(NAME, taken), Grant)
    await advance(store, clock, 54)
    await backend.sync(NAME, remaining, 30_000_000)
    if algorithm is not BUCKET:
        assert await backend.available_permits(NAME) == min(remaining, 10 - taken)
    granted = await _granted_each_second(store, clock, backend, 30)
    assert granted == remaining if algorithm is not BUCKET else granted <= remaining


@ALGORITHMS
async def test_a_settle_after_a_sync_frees_no_more_than_it_took_before_the_reset(
    store: Any, algorithm: Algorithm
) -> None:
    # 6 reserved at 0 of 10 per minute; at 54 s the provider says none are left until 84 s,
    # then the call is settled for none. The other 4 the provider counts hold until its
    # reset. A sliding window frees the 6 the grant took, which leave the provider's count
    # as the call completes (tests/test_sliding_floors.py); fixed windows and a token bucket
    # keep a grant from before the sync counted until the reset.
    clock, backend = await limiter(store, algorithm)
    grant = await take(backend, 6)
    await advance(store, clock, 54)
    await backend.sync(NAME, 0, 30_000_000)
    await backend.settle(NAME, grant.member, 0)
    freed = 6 if algorithm is SLIDING else 0
    assert await _granted_each_second(store, clock, backend, 30) == freed


async def test_sync_on_a_sliding_window_counts_for_at_most_one_interval(store: Any) -> None:
    clock, backend = await limiter(store, SLIDING)
    await backend.sync(NAME, 0, 3_600_000_000)
    assert await backend.available_permits(NAME) == 0
    await advance(store, clock, 60)
    assert await backend.available_permits(NAME) == 10


async def test_max_debt_is_kept_with_the_config(store: Any) -> None:
    backend = store.backend("client-a")
    config = RateLimiterConfig.build(OVERALL, "10/minute", max_debt=4)
    await backend.set_rate(NAME, config, "set", False)
    assert await backend.get_config(NAME) == config
    default = RateLimiterConfig.build(OVERALL, "10/minute")
    await backend.set_rate(NAME, default, "set", False)
    assert (await backend.get_config(NAME)) == default
    assert default.max_debt is None and default.debt_limit == 10
    if isinstance(backend, RedisBackend):
        fields = await backend.redis.hgetall(backend.keys(NAME).config)
        assert b"max_debt" not in fields


@pytest.mark.parametrize("max_debt", [-1, True, math.nan, 1.5, "3", 2**51])
def test_a_bad_max_debt_is_refused(max_debt: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="max_debt"):
        RateLimiterConfig.build(OVERALL, "10/minute", max_debt=max_debt)


@pytest.mark.parametrize("permits", [-1, True, math.nan, 1.5, "3", 2**53, None])
async def test_settle_refuses_bad_permits(store: Any, permits: Any) -> None:
    _, backend = await limiter(store, SLIDING)
    grant = await take(backend, 2)
    with pytest.raises(InvalidArgumentError):
        await backend.settle(NAME, grant.member, permits)
    with pytest.raises(InvalidArgumentError):
        await backend.settle(NAME, "not a member", 1)
    assert await backend.available_permits(NAME) == 8


@pytest.mark.parametrize(
    ("remaining", "reset_us"),
    [(-1, 1), (True, 1), (math.nan, 1), (1.5, 1), (1, -1), (1, False), (1, 2.0), (1, 2**60)],
)
async def test_sync_refuses_bad_arguments(store: Any, remaining: Any, reset_us: Any) -> None:
    _, backend = await limiter(store, SLIDING)
    with pytest.raises(InvalidArgumentError):
        await backend.sync(NAME, remaining, reset_us)
    assert await backend.available_permits(NAME) == 10


async def test_a_backend_without_settle_says_so() -> None:
    class Bare(MemoryBackend):
        settle = Backend.settle  # type: ignore[assignment]
        sync = Backend.sync  # type: ignore[assignment]

    with pytest.raises(NotImplementedError, match="cannot settle"):
        await Bare().settle(NAME, "1:0:0", 1)
    with pytest.raises(NotImplementedError, match="cannot sync"):
        await Bare().sync(NAME, 1, 1)


@ALGORITHMS
@RATE_TYPES
@pytest.mark.parametrize("settled", [2, 6, 8], ids=["fewer", "same", "more"])
async def test_a_settle_with_a_cap_is_the_settle_then_the_sync_in_one_call(
    store: Any, algorithm: Algorithm, rate_type: RateType, settled: int
) -> None:
    # One limiter settles, then syncs; its twin does both in one call (the HTTP clients'
    # metered calls): they answer alike and hold alike, now and later.
    clock, backend = await limiter(store, algorithm, rate_type)
    config = RateLimiterConfig.build(rate_type, "10/minute", algorithm=algorithm)
    assert await backend.set_rate("twin", config, "set", False)
    grant, twin = await take(backend, 6), await backend.try_acquire("twin", 6, 0)
    assert isinstance(twin, Grant)
    await advance(store, clock, 1)
    apart = await backend.settle(NAME, grant.member, settled)
    await backend.sync(NAME, 1, 20_000_000)
    together = await backend.settle_and_sync("twin", twin.member, settled, 1, 20_000_000)
    assert (together.handed_back, together.charged, together.cut) == (
        apart.handed_back,
        apart.charged,
        apart.cut,
    )
    # Sent again (a client library's resend): the settle changes nothing, the cap holds.
    again = await backend.settle_and_sync("twin", twin.member, settled, 1, 20_000_000)
    assert (again.handed_back, again.charged) == (0, 0)
    for step in (0, 10, 15, 60):
        await advance(store, clock, step)
        assert await backend.available_permits("twin") == await backend.available_permits(NAME)
