"""A provider's floor across a fixed window's end (``Backend.sync``): after
``sync(remaining, reset)`` at t, at most ``remaining`` more are granted before t + reset, and
no fewer than the limiter and the provider both allow, however the grants fall on either side
of the limiter's own window edge. A hand-back frees exactly what its grant took, in both
windows. On every store, on a clock the test moves."""

from __future__ import annotations

import math
from typing import Any

import pytest
from conformance import ManualClock, advance
from settling import FIXED, NAME, RATE_TYPES, limiter, take

from aiolimit import RateLimiter, RateType
from aiolimit._meter import sync_from
from aiolimit.backends import Backend, Grant

SPLITS = pytest.mark.parametrize(
    ("before", "after"), [(4, 0), (0, 4), (2, 2)], ids=["all-before", "all-after", "split"]
)
EDGE_SIDES = pytest.mark.parametrize("back_at", [0.75, 1.25], ids=["same-window", "next-window"])
LAST = 1.499_999  # the last microsecond before the provider's reset at 1.5


async def synced(
    store: Any, rate_type: RateType = RateType.OVERALL, reset: float = 1.0
) -> tuple[ManualClock, Backend, Grant]:
    """10 per second, 3 granted at 0; at 0.5 the provider says 4 are left until ``reset`` on
    (the first grant's too)."""
    clock, backend = await limiter(store, FIXED, rate_type, rates="10/second")
    first = await take(backend, 3)
    await advance(store, clock, 0.5)
    await backend.sync(NAME, 4, round(reset * 1e6))
    return clock, backend, first


async def granted(backend: Backend, most: int = 20) -> int:
    """Takes single permits until one is refused (at most ``most``); how many."""
    count = 0
    while count < most and isinstance(await backend.try_acquire(NAME, 1), Grant):
        count += 1
    return count


class Times:
    """Moves a test's clock to times from its first grant, in seconds (the sync at 0.5)."""

    def __init__(self, store: Any, clock: ManualClock) -> None:
        self.store, self.clock, self.at = store, clock, 0.5

    async def to(self, when: float) -> None:
        await advance(self.store, self.clock, when - self.at)
        self.at = when

    async def granted(self, backend: Backend, *times: float) -> int:
        """Takes every permit free at each of ``times`` (rising); how many."""
        count = 0
        for when in times:
            await self.to(when)
            count += await granted(backend)
        return count


@RATE_TYPES
@SPLITS
async def test_exactly_the_remaining_are_granted_until_the_reset_across_the_edge(
    store: Any, rate_type: RateType, before: int, after: int
) -> None:
    clock, backend, _ = await synced(store, rate_type)
    times = Times(store, clock)
    # Before the edge at 1.0: what the window has left (7), or what the provider says (4).
    assert await backend.available_permits(NAME) == 4
    for _ in range(before):
        assert isinstance(await backend.try_acquire(NAME, 1), Grant)
    if before == 4:
        assert await granted(backend) == 0
    # After it, until the reset at 1.5: the rest of the 4, whatever the window's own count.
    assert await times.granted(backend, 1.0, 1.25, LAST) == after
    # From the reset on, the window's own budget alone: 10 less what it granted itself.
    await times.to(1.5)
    assert await backend.available_permits(NAME) == 10 - after
    assert await granted(backend) == 10 - after


@RATE_TYPES
async def test_a_reset_past_the_next_window_counts_for_one_interval(
    store: Any, rate_type: RateType
) -> None:
    clock, backend, _ = await synced(store, rate_type, reset=5.0)
    times = Times(store, clock)
    assert isinstance(await backend.try_acquire(NAME, 2), Grant)
    assert await times.granted(backend, 1.0, LAST) == 2
    await times.to(1.5)  # one interval after the sync: the window's own budget
    assert await granted(backend) == 8


@RATE_TYPES
async def test_a_reset_within_the_window_holds_until_the_reset_not_the_windows_end(
    store: Any, rate_type: RateType
) -> None:
    clock, backend, _ = await synced(store, rate_type, reset=0.25)  # 4 left until 0.75
    times = Times(store, clock)
    assert await times.granted(backend, 0.5, 0.749_999) == 4
    await times.to(0.75)  # the window's own count again: 3 + 4 of 10
    assert await backend.available_permits(NAME) == 3
    assert await granted(backend) == 3


@pytest.mark.parametrize(("reset", "waits"), [(0.25, 0.25), (1.0, 1.0)], ids=["within", "past"])
async def test_a_request_the_floor_alone_holds_back_waits_until_the_reset(
    store: Any, reset: float, waits: float
) -> None:
    # 4 left until 0.5 + reset, all taken at 0.5: the window's own budget (3 + 4 of 10) would
    # allow more now, and the next window's too, but not before the provider's reset.
    _, backend, _ = await synced(store, reset=reset)
    assert await granted(backend) == 4
    assert await backend.wait_time(NAME, 1) == round(waits * 1e6)
    reserved = await take(backend, 2, wait=True)
    assert reserved.starts_in == round(waits * 1e6)


@EDGE_SIDES
@pytest.mark.parametrize("how", ["release", "settle"])
async def test_a_grant_after_the_sync_hands_back_exactly_what_it_took(
    store: Any, back_at: float, how: str
) -> None:
    clock, backend, _ = await synced(store)
    times = Times(store, clock)
    await times.to(0.6)
    grant = await take(backend, 2)  # from the window's 7 and the provider's 4
    await times.to(back_at)
    assert await backend.available_permits(NAME) == 2
    if how == "release":
        assert await backend.release(NAME, 2, grant.member) == 2
    else:
        assert (await backend.settle(NAME, grant.member, 0)).handed_back == 2
    assert await backend.available_permits(NAME) == 4
    assert await times.granted(backend, back_at, LAST) == 4  # never more than the provider's 4
    await times.to(1.5)
    # (the window of 1.0 counts its own grants: those after the edge)
    assert await granted(backend) == 10 - (4 if back_at > 1 else 0)


@EDGE_SIDES
async def test_settling_a_grant_after_the_sync_for_fewer_hands_back_the_difference_in_both_windows(
    store: Any, back_at: float
) -> None:
    clock, backend, _ = await synced(store)
    times = Times(store, clock)
    await times.to(0.6)
    grant = await take(backend, 3)
    await times.to(back_at)
    assert (await backend.settle(NAME, grant.member, 1)).handed_back == 2
    assert await times.granted(backend, back_at, LAST) == 3


async def test_settling_a_grant_after_the_sync_for_more_counts_in_both_windows(store: Any) -> None:
    clock, backend, _ = await synced(store)
    times = Times(store, clock)
    await times.to(0.6)
    grant = await take(backend, 1)
    assert (await backend.settle(NAME, grant.member, 3)).charged == 2
    assert await times.granted(backend, 0.75, 1.0, LAST) == 1


@RATE_TYPES
async def test_a_hand_back_of_a_grant_before_the_sync_frees_nothing_the_provider_counts(
    store: Any, rate_type: RateType
) -> None:
    # The provider's 4 counts the 3 granted at 0: handing them back (a call that was never
    # sent, or cost nothing) leaves what it says is left as it is.
    clock, backend, first = await synced(store, rate_type)
    times = Times(store, clock)
    await times.to(0.6)
    assert await backend.release(NAME, 3, first.member) == 0
    assert await backend.available_permits(NAME) == 4
    assert await times.granted(backend, 0.75, 1.0, LAST) == 4


# -- what it delivers: a limiter synced from a fixed-window provider's headers ----------------


class Provider:
    """A partner that allows ``quota`` calls per minute in fixed windows that start
    ``offset`` seconds after the limiter's, and answers each call with its OpenAI-style
    headers: what is left, and the time to its window's end (as whole seconds, rounded up,
    when ``whole``)."""

    INTERVAL_US = 60_000_000

    def __init__(self, quota: int, offset: float, whole: bool) -> None:
        self.quota, self.offset_us, self.whole = quota, round(offset * 1e6), whole
        self.counts: dict[int, int] = {}
        self.refused = 0

    def window(self, at_us: int) -> int:
        return (at_us - self.offset_us) // self.INTERVAL_US

    def call(self, at_us: int) -> dict[str, str]:
        window = self.window(at_us)
        if self.counts.get(window, 0) < self.quota:
            self.counts[window] = self.counts.get(window, 0) + 1
        else:
            self.refused += 1
        reset = ((window + 1) * self.INTERVAL_US + self.offset_us - at_us) / 1e6
        return {
            "x-ratelimit-remaining-requests": str(self.quota - self.counts.get(window, 0)),
            "x-ratelimit-reset-requests": f"{math.ceil(reset)}s" if self.whole else f"{reset}s",
        }


async def delivered(store: Any, offset: float, whole: bool) -> tuple[int, int, int]:
    """A call every 2.9 s for 15 minutes (twice the quota), each through a 10-per-minute
    fixed-window limiter synced from the provider's headers: ``(calls the provider took in
    its windows wholly inside the run, what it would have taken there, calls it refused)``."""
    clock, backend = await limiter(store, FIXED, rates="10/minute")
    limited, provider = RateLimiter(NAME, backend), Provider(10, offset, whole)
    start = round(clock() * 1e6)
    for _ in range(310):
        if await limited.try_acquire():
            await sync_from(provider.call(round(clock() * 1e6)), limited, "requests")
        await advance(store, clock, 2.9)
    end = round(clock() * 1e6)
    first, last = provider.window(start) + 1, provider.window(end) - 1
    took = sum(provider.counts.get(window, 0) for window in range(first, last + 1))
    return took, 10 * (last - first + 1), provider.refused


@pytest.mark.slow
@pytest.mark.parametrize("offset", [0.5, 15.0, 30.0, 45.0])
@pytest.mark.parametrize("whole", [False, True], ids=["exact-reset", "whole-seconds"])
async def test_a_limiter_synced_on_every_call_delivers_what_the_provider_allows(
    store: Any, offset: float, whole: bool
) -> None:
    took, allowed, refused = await delivered(store, offset, whole)
    assert refused == 0
    assert took >= 0.95 * allowed, f"{took} of the {allowed} the provider allows"
