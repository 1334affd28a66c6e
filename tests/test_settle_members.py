"""A grant's member is never issued twice, even when settles and hand-backs empty a budget and
later grants start at the same microsecond: a settle or a release names one grant, never a
later one that happens to take the same slot (every backend, algorithm and rate type, on a
clock the test moves)."""

from __future__ import annotations

from typing import Any

import pytest
from conformance import advance
from settling import ALGORITHMS, NAME, RATE_TYPES, limiter, take

from aiolimit import Algorithm, RateType
from aiolimit.backends import Backend, Grant
from aiolimit.backends._protocol import parse_grant


def permits(grant: Grant) -> int:
    return parse_grant(grant.member)[0]


async def settled_to_zero(backend: Backend, grant: Grant) -> None:
    assert (await backend.settle(NAME, grant.member, 0)).handed_back == permits(grant)


async def assert_settles_on_its_own(backend: Backend, old: Grant, new: Grant) -> None:
    """``new`` took the slot ``old`` gave back: the old member names nothing any more, the new
    one names ``new`` alone."""
    assert new.member != old.member
    before = await backend.available_permits(NAME)
    # A stale settle or release of the old grant (a resend, a second process) moves nothing.
    assert (await backend.settle(NAME, old.member, 0)).handed_back == 0
    assert await backend.release(NAME, permits(old), old.member) == 0
    assert await backend.available_permits(NAME) == before
    # The new grant settles for what it is.
    settled = await backend.settle(NAME, new.member, 1)
    assert (settled.handed_back, settled.charged) == (permits(new) - 1, 0)
    assert await backend.available_permits(NAME) == before + permits(new) - 1


async def released(backend: Backend, grant: Grant) -> None:
    assert await backend.release(NAME, permits(grant), grant.member) == permits(grant)


@ALGORITHMS
@RATE_TYPES
@pytest.mark.parametrize("hand_back", [settled_to_zero, released], ids=["settled", "released"])
async def test_a_grant_in_the_slot_of_one_handed_back_has_its_own_member(
    store: Any, algorithm: Algorithm, rate_type: RateType, hand_back: Any
) -> None:
    _, backend = await limiter(store, algorithm, rate_type)
    first = await take(backend, 4)
    await hand_back(backend, first)  # the budget is empty again, the clock stands
    second = await take(backend, 4)
    assert second.starts_at == first.starts_at
    await assert_settles_on_its_own(backend, first, second)


@ALGORITHMS
@RATE_TYPES
async def test_a_grant_at_the_start_of_a_reservation_settled_to_zero_has_its_own_member(
    store: Any, algorithm: Algorithm, rate_type: RateType
) -> None:
    clock, backend = await limiter(store, algorithm, rate_type)
    full = await take(backend, 10)
    reserved = await take(backend, 10, wait=True)
    assert reserved.starts_in > 0
    await settled_to_zero(backend, reserved)
    await advance(store, clock, (reserved.starts_at - full.starts_at) / 1e6)
    # The first grant has left; grants at the reservation's start count up again.
    later = await take(backend, 10)
    assert later.starts_at == reserved.starts_at
    await assert_settles_on_its_own(backend, reserved, later)


@pytest.mark.parametrize("rate_type", list(RateType), ids=lambda t: t.name.lower())
async def test_a_sliding_window_grant_never_takes_the_number_of_one_settled_away(
    store: Any, rate_type: RateType
) -> None:
    clock, backend = await limiter(store, Algorithm.SLIDING_WINDOW, rate_type)
    await take(backend, 5)
    reserved = await take(backend, 9, wait=True)  # the log's second entry
    await settled_to_zero(backend, reserved)
    await advance(store, clock, 60)  # the first grant leaves: the log is empty
    await take(backend, 1)
    again = await take(backend, 9)  # the log's second entry again, at the same start
    assert again.starts_at == reserved.starts_at
    await assert_settles_on_its_own(backend, reserved, again)
