"""A grant names the life of the state it was taken from: once the limiter has been reset
(deleted and made again, ``set_rate(keep_state=False)``, another algorithm, the store
flushed and the limiter made again), a late settle or release of a grant of the old life
moves nothing of the new one's. Every backend, algorithm and rate type, on a clock the
test moves: 10 per minute, the old life's 10 taken, the new life's 10 taken, then the old
grant settled or released: nothing may come back, and nothing more is granted."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from conformance import advance, flush
from settling import ALGORITHMS, NAME, RATE_TYPES, limiter, take

from aiolimit import Algorithm, RateLimiterConfig, RateType
from aiolimit.backends import Backend, Grant, Refusal

Reset = Callable[[Any, Backend, Algorithm, RateType], Awaitable[None]]


def config(algorithm: Algorithm, rate_type: RateType) -> RateLimiterConfig:
    return RateLimiterConfig.build(rate_type, "10/minute", algorithm=algorithm)


async def deleted(store: Any, backend: Backend, algorithm: Algorithm, rate_type: RateType) -> None:
    assert await backend.delete(NAME)
    assert await backend.set_rate(NAME, config(algorithm, rate_type), "set", False)


async def set_afresh(
    store: Any, backend: Backend, algorithm: Algorithm, rate_type: RateType
) -> None:
    assert await backend.set_rate(NAME, config(algorithm, rate_type), "set", False)


async def flushed(store: Any, backend: Backend, algorithm: Algorithm, rate_type: RateType) -> None:
    await flush(store)
    assert await backend.set_rate(NAME, config(algorithm, rate_type), "set", False)


def switched_to(to: Algorithm) -> Reset:
    async def switched(
        store: Any, backend: Backend, algorithm: Algorithm, rate_type: RateType
    ) -> None:
        # (keep_state asked for, but another algorithm's state cannot be kept)
        assert await backend.set_rate(NAME, config(to, rate_type), "set", True)

    return switched


RESETS: dict[str, Reset] = {
    "deleted": deleted,
    "set_rate": set_afresh,
    "flushed": flushed,
    **{f"to_{to.name.lower()}": switched_to(to) for to in Algorithm},
}


async def settled_to_zero(backend: Backend, old: Grant) -> int:
    settled = await backend.settle(NAME, old.member, 0)
    assert settled.charged == 0
    return settled.handed_back


async def settled_to_four(backend: Backend, old: Grant) -> int:
    settled = await backend.settle(NAME, old.member, 4)
    assert settled.charged == 0
    return settled.handed_back


async def released(backend: Backend, old: Grant) -> int:
    return await backend.release(NAME, 10, old.member)


OPERATIONS = pytest.mark.parametrize(
    "operation",
    [settled_to_zero, settled_to_four, released],
    ids=["settle_0", "settle_4", "release"],
)


# Each algorithm with each reset, to another algorithm than its own.
RESET_CASES = pytest.mark.parametrize(
    ("algorithm", "reset"),
    [
        pytest.param(algorithm, reset, id=f"{algorithm.name.lower()}-{reset}")
        for algorithm in Algorithm
        for reset in RESETS
        if reset != f"to_{algorithm.name.lower()}"
    ],
)


async def assert_old_grant_moves_nothing(
    store: Any, algorithm: Algorithm, rate_type: RateType, reset: str, operation: Any, gap: float
) -> None:
    clock, backend = await limiter(store, algorithm, rate_type)
    old = await take(backend, 10)
    await advance(store, clock, gap)
    await RESETS[reset](store, backend, algorithm, rate_type)
    new = await take(backend, 10)  # the new life's whole budget
    assert await operation(backend, old) == 0
    assert await backend.available_permits(NAME) == 0
    refused = await backend.try_acquire(NAME, 1, 0)
    assert isinstance(refused, Refusal), f"{refused}: 21 permits in one minute"
    # The new life's grant still settles for what it is.
    assert (await backend.settle(NAME, new.member, 7)).handed_back == 3


@RESET_CASES
@RATE_TYPES
@OPERATIONS
async def test_a_grant_of_a_limiter_since_reset_settles_and_releases_nothing(
    store: Any, algorithm: Algorithm, rate_type: RateType, reset: str, operation: Any
) -> None:
    await assert_old_grant_moves_nothing(store, algorithm, rate_type, reset, operation, 1.0)


@RESET_CASES
async def test_a_grant_of_a_limiter_reset_in_the_same_microsecond_settles_nothing(
    store: Any, algorithm: Algorithm, reset: str
) -> None:
    # The new life's first grant has the old one's permits, start and tag.
    await assert_old_grant_moves_nothing(
        store, algorithm, RateType.OVERALL, reset, settled_to_zero, 0.0
    )


@ALGORITHMS
async def test_a_grant_of_a_limiter_still_alive_settles_as_before(
    store: Any, algorithm: Algorithm
) -> None:
    # set_rate keeping the state (the same algorithm, other rates) keeps the life.
    _, backend = await limiter(store, algorithm)
    old = await take(backend, 10)
    changed = RateLimiterConfig.build(RateType.OVERALL, "20/minute", algorithm=algorithm)
    assert await backend.set_rate(NAME, changed, "update", True)
    assert (await backend.settle(NAME, old.member, 4)).handed_back == 6
