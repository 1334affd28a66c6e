"""Hand-backs (``Backend.release`` of one grant's member) on every backend and algorithm: a
member names one grant for the limiter's whole life, and handing it back returns only what it
still holds against the limit; handing it back twice returns it once.

Each test runs on the memory backend (virtual time: exact), fakeredis, a real redis-server and
a real Valkey (real time: short intervals).
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from conformance import manual_clock, now, reservations

import aiolimit
from aiolimit import (
    Algorithm,
    BackendError,
    MemoryBackend,
    Rate,
    RateLimiter,
    RateLimiterConfig,
    RateType,
)
from aiolimit.backends import Backend, Grant
from tools import busiest_window

OVERALL, PER_CLIENT = RateType.OVERALL, RateType.PER_CLIENT
ALGORITHMS = pytest.mark.parametrize("algorithm", list(Algorithm), ids=lambda a: a.name.lower())
RATE_TYPES = pytest.mark.parametrize("rate_type", list(RateType), ids=lambda t: t.name.lower())


async def configured(store, name, rates, algorithm, rate_type=OVERALL) -> Backend:
    backend = store.backend("client-a")
    await RateLimiter(name, backend).set_rate(
        RateLimiterConfig.build(rate_type, rates, algorithm=algorithm)
    )
    return backend


async def grants(backend: Backend, name: str, count: int, permits: int = 1) -> list[str]:
    """Takes ``count`` grants at once; their members."""
    members = []
    for _ in range(count):
        grant = await backend.try_acquire(name, permits)
        assert isinstance(grant, Grant), f"refused: {grant}"
        members.append(grant.member)
    return members


async def at_window_start(store, interval: float) -> None:
    """Sleeps until a fixed window of ``interval`` starts on the limiter's clock (the server's
    TIME on Redis, the loop's on the memory backend)."""
    clock = time.time() if store.is_redis else now()
    await asyncio.sleep(interval - clock % interval + 0.003)


async def granted(backend: Backend, name: str, most: int = 20) -> int:
    """How many single permits are granted now (at most ``most``)."""
    count = 0
    for _ in range(most):
        if not isinstance(await backend.try_acquire(name, 1), Grant):
            break
        count += 1
    return count


@pytest.mark.slow
@ALGORITHMS
@RATE_TYPES
async def test_a_stale_hand_back_frees_nothing(store, name, algorithm, rate_type):
    # 5 per second; 3 grants kept; 1.3 s later 5 more; handing back the 3 old ones must not
    # give 3 more permits (8 within milliseconds).
    backend = await configured(store, name, [Rate(5, 1)], algorithm, rate_type)
    await at_window_start(store, 1)  # (fixed windows: the 5 new grants share one)
    old = await grants(backend, name, 3)
    await asyncio.sleep(1.3)
    new = await grants(backend, name, 5)
    assert not set(old) & set(new), f"members issued twice: {old} and {new}"
    for member in old:
        assert await backend.release(name, 1, member) == 0
    assert await backend.available_permits(name) == 0
    assert await granted(backend, name) == 0


@pytest.mark.slow
@ALGORITHMS
async def test_members_are_never_issued_twice(store, name, algorithm):
    # A sliding window's log started its numbers over whenever it emptied: 1:1 three times
    # within seconds.
    backend = await configured(store, name, [Rate(3, 0.1)], algorithm)
    members: list[str] = []
    for _ in range(6):
        members += await grants(backend, name, 3)
        await asyncio.sleep(0.15)
    assert len(set(members)) == len(members), sorted(members)


@ALGORITHMS
async def test_a_grant_handed_back_twice_comes_back_once(store, name, algorithm):
    backend = await configured(store, name, [Rate(5, 10)], algorithm)
    members = await grants(backend, name, 5)
    assert await backend.release(name, 1, members[0]) == 1
    assert await backend.release(name, 1, members[0]) == 0
    assert await granted(backend, name) == 1


@pytest.mark.slow
async def test_a_token_bucket_hands_back_only_the_tokens_not_yet_refilled(store, name):
    # 10 per 2 s, a token every 0.2 s. Two grants of 5 empty the bucket; after 1.1 s the
    # first grant's 5 tokens are back (the bucket refills oldest first): handing it back then
    # returns nothing, while a hand-back at once returns all.
    backend = await configured(store, name, [Rate(10, 2)], Algorithm.TOKEN_BUCKET)
    first, _second = await grants(backend, name, 2, permits=5)
    await asyncio.sleep(1.1)
    assert await backend.available_permits(name) == 5
    assert await backend.release(name, 5, first) == 0
    assert await backend.available_permits(name) == 5
    [third] = await grants(backend, name, 1, permits=5)
    assert await backend.release(name, 5, third) == 5
    assert await backend.available_permits(name) == 5


# -- no key per hand-back -------------------------------------------------------------------------


@pytest.mark.slow
@ALGORITHMS
@RATE_TYPES
@pytest.mark.parametrize("store", ["fakeredis", "redis"], indirect=True)
async def test_hand_backs_leave_no_key_each(store, name, algorithm, rate_type):
    # A refusal that hands back another rule's grant left a `released:<id>` key for 60 s: 2 000
    # refusals made 2 000 keys (300 here show it as well). (On a clock the test holds still:
    # a fixed window's grant handed back after its window has ended returns nothing, rightly,
    # and 2 000 round trips on the wall clock may cross a minute. It moves a microsecond a
    # grant, as any clock does between two round trips.)
    clock, backend = manual_clock(store)
    await RateLimiter(name, backend).set_rate(
        RateLimiterConfig.build(rate_type, [Rate(10, 60)], algorithm=algorithm)
    )
    redis = backend.redis  # type: ignore[attr-defined]
    for _ in range(300):
        clock.advance(1e-6)
        [member] = await grants(backend, name, 1)
        assert await backend.release(name, 1, member) == 1
    for _ in range(50):
        assert await backend.release(name, 1) == 0  # nothing to hand back: a receipt each
    keys = await redis.keys("*")
    assert len(keys) <= 5, sorted(keys)
    assert await granted(backend, name) == 10


# -- failed hand-backs are logged once per batch, with a count ---------------------------------


class _ReleaseFails(MemoryBackend):
    """A memory store whose hand-backs fail (the store went away meanwhile)."""

    async def release(self, name: str, permits: int, member: str | None = None) -> int:
        raise BackendError("the store is unreachable")


def hand_back_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        record
        for record in caplog.records
        if record.name == "aiolimit" and "could not hand back" in record.getMessage()
    ]


@pytest.mark.looptime
async def test_failed_hand_backs_of_cancelled_callers_are_one_warning_with_their_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = _ReleaseFails()
    limiter = RateLimiter("failing-hand-backs", backend)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 100, 1))
    members = await grants(backend, "failing-hand-backs", 50)
    with caplog.at_level(logging.WARNING, logger="aiolimit"):
        for member in members:
            backend.hand_back("failing-hand-backs", member)
        await backend.aclose()  # waits for them, and says what failed
        (warning,) = hand_back_warnings(caplog)
        assert "50 grants" in warning.getMessage()
        assert "unreachable" in warning.getMessage()
        assert warning.exc_info is None  # one line, no traceback per grant
        # Later failures are reported again, once, after a short while.
        for member in members[:3]:
            backend.hand_back("failing-hand-backs", member)
        await asyncio.sleep(10)
        (later,) = hand_back_warnings(caplog)[1:]
        assert "3 grants" in later.getMessage()


@pytest.mark.looptime
async def test_failed_hand_backs_of_a_refused_request_are_one_warning_with_their_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = _ReleaseFails()
    limiters = [RateLimiter(f"refused-{i}", backend) for i in range(4)]
    for limiter in limiters:
        await limiter.set_rate(RateLimiterConfig.build(OVERALL, 1, 60))
    assert await limiters[-1].try_acquire()  # the last one refuses what follows
    with caplog.at_level(logging.WARNING, logger="aiolimit"):
        acquired = await aiolimit.acquire_all([(limiter, 1) for limiter in limiters])
        assert not acquired
        await asyncio.sleep(10)
        (warning,) = hand_back_warnings(caplog)
        assert "3 grants" in warning.getMessage()
        assert warning.exc_info is None


# -- a hand-back frees only the slot it took -------------------------------------------------------


@ALGORITHMS
@RATE_TYPES
async def test_handing_back_queued_reservations_never_lets_more_start_than_the_rate(
    store, name, algorithm, rate_type
):
    # 10 per second. A token bucket lets at most 10 + 10 * w / 1 s start in any w < 1 s: 19.
    # Its release moved the bucket back by each handed-back reservation even with later ones
    # queued behind it, so the next requests landed on their slots: 30 starts in one second.
    clock, backend = manual_clock(store)
    await RateLimiter(name, backend).set_rate(
        RateLimiterConfig.build(rate_type, [Rate(10, 1)], algorithm=algorithm)
    )
    live = await reservations(backend, name, 10)
    batches = [await reservations(backend, name, 10) for _ in range(3)]
    for cancelled in range(2):
        for grant in batches[cancelled]:
            clock.advance(1e-6)
            await backend.release(name, 1, grant.member)
        batches.append(await reservations(backend, name, 10))
    live += [grant for batch in batches[2:] for grant in batch]
    most = busiest_window([grant.starts_at for grant in live], 1_000_000).most
    assert most <= 19, f"{most} grants start within one second"


@ALGORITHMS
@RATE_TYPES
async def test_releasing_permits_while_reservations_are_queued_frees_no_queued_slot(
    store, name, algorithm, rate_type
):
    # `limiter.release(1)` x30 with reservations queued: 40 starts within one second.
    clock, backend = manual_clock(store)
    await RateLimiter(name, backend).set_rate(
        RateLimiterConfig.build(rate_type, [Rate(10, 1)], algorithm=algorithm)
    )
    live = await reservations(backend, name, 20)
    for _ in range(30):
        clock.advance(1e-6)
        await backend.release(name, 1)
    live += await reservations(backend, name, 10)
    most = busiest_window([grant.starts_at for grant in live], 1_000_000).most
    assert most <= 19, f"{most} grants start within one second"


@ALGORITHMS
async def test_the_latest_reservations_handed_back_last_first_free_their_slots(
    store, name, algorithm
):
    # What can go back does: cancelling the queue from its end frees every slot, and the next
    # request is given the first of them again.
    _clock, backend = manual_clock(store)
    await RateLimiter(name, backend).set_rate(
        RateLimiterConfig.build(OVERALL, [Rate(10, 1)], algorithm=algorithm)
    )
    await reservations(backend, name, 10)
    queued = await reservations(backend, name, 5)
    for grant in reversed(queued):
        assert await backend.release(name, 1, grant.member) == 1
    [again] = await reservations(backend, name, 1)
    assert again.starts_at == queued[0].starts_at
    assert again.member != queued[0].member


@ALGORITHMS
@RATE_TYPES
async def test_a_reservation_on_a_handed_back_slot_is_a_grant_of_its_own(
    store, name, algorithm, rate_type
):
    # A reservation that landed on the slot a handed-back one had got the same member, so its
    # own hand-back returned 0 (taken for a resend) and its permit stayed spent.
    _clock, backend = manual_clock(store)
    await RateLimiter(name, backend).set_rate(
        RateLimiterConfig.build(rate_type, [Rate(10, 1)], algorithm=algorithm)
    )
    await reservations(backend, name, 10)
    members = []
    for _ in range(3):
        [grant] = await reservations(backend, name, 1)
        members.append(grant.member)
        assert await backend.release(name, 1, grant.member) == 1, members
    assert len(set(members)) == len(members), members
    assert await backend.available_permits(name) == 0
