"""Reserve, then settle (``Acquired.settle``) and sync (``limiter.sync``) through the limiters:
a plain limiter, a client's view, a sharded limiter and ``acquire_all``, on every backend, on a
clock the test moves."""

from __future__ import annotations

import asyncio
import logging
import math
from datetime import timedelta
from typing import Any

import pytest
from conformance import ManualClock, advance, cancelled, new_client, now, tolerance

from aiolimit import (
    Algorithm,
    InvalidArgumentError,
    Observer,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
    Settlement,
    ShardedRateLimiter,
    acquire_all,
    observe,
)

OVERALL, PER_CLIENT = RateType.OVERALL, RateType.PER_CLIENT
SLIDING, FIXED = Algorithm.SLIDING_WINDOW, Algorithm.FIXED_WINDOW


def counts(settlement: Settlement) -> tuple[int, int, int]:
    """What a settle did, without the member it names the grant by from then on."""
    return settlement.handed_back, settlement.charged, settlement.cut


ALGORITHMS = pytest.mark.parametrize("algorithm", list(Algorithm), ids=lambda a: a.name.lower())


async def on_clock(
    store: Any,
    rates: str = "10/minute",
    algorithm: Algorithm = SLIDING,
    rate_type: RateType = OVERALL,
    max_debt: int | None = None,
    name: str = "llm",
) -> tuple[ManualClock, RateLimiter]:
    """A limiter on a clock the test moves (starting at a window's start)."""
    clock = ManualClock()
    limiter = RateLimiter(name, new_client(store, clock=clock))
    await limiter.set_rate(
        RateLimiterConfig.build(rate_type, rates, algorithm=algorithm, max_debt=max_debt)
    )
    return clock, limiter


class Cuts(Observer):
    def __init__(self) -> None:
        self.cuts: list[tuple[str, int]] = []

    def debt_cut(self, name: str, permits: int) -> None:
        self.cuts.append((name, permits))


@ALGORITHMS
async def test_settling_for_fewer_hands_back_and_release_then_hands_back_the_rest(
    store: Any, algorithm: Algorithm
) -> None:
    _, limiter = await on_clock(store, algorithm=algorithm)
    acquired = await limiter.reserve(6)
    assert counts(await acquired.settle(2)) == (4, 0, 0)
    assert await limiter.available_permits() == 8
    await acquired.release()  # what the grant holds now: 2
    assert await limiter.available_permits() == 10


async def test_settling_twice_returns_the_first_result_and_changes_nothing(store: Any) -> None:
    _, limiter = await on_clock(store)
    acquired = await limiter.reserve(6)
    first = await acquired.settle(2)
    assert await acquired.settle(9) == first
    assert counts(first) == (4, 0, 0)
    assert await limiter.available_permits() == 8
    await acquired.release()
    assert await acquired.settle(0) == first  # still the first result, after a release


@ALGORITHMS
async def test_a_refund_of_a_grant_that_has_aged_out_hands_back_nothing(
    store: Any, algorithm: Algorithm
) -> None:
    clock, limiter = await on_clock(store, algorithm=algorithm)
    acquired = await limiter.reserve(10)
    await advance(store, clock, 61)  # out of its window; its tokens have come back
    assert counts(await acquired.settle(0)) == (0, 0, 0)
    assert await limiter.available_permits() == 10
    assert await limiter.try_acquire(10)  # no refund beyond the rate
    assert not await limiter.try_acquire(1)


@ALGORITHMS
async def test_an_acquisition_from_before_a_reset_settles_nothing(
    store: Any, algorithm: Algorithm
) -> None:
    # 10 per minute: the limiter deleted and made again, and so after set_rate without the
    # state: the new life takes its 10, and the old acquisition settled to 0 frees none of
    # them (20 in one minute, else).
    clock, limiter = await on_clock(store, algorithm=algorithm)
    for reset in ("deleted", "set_rate"):
        old = await limiter.reserve(10)
        await advance(store, clock, 1)
        if reset == "deleted":
            await limiter.delete()
        await limiter.set_rate(
            RateLimiterConfig.build(OVERALL, "10/minute", algorithm=algorithm), keep_state=False
        )
        assert await limiter.reserve(10)
        assert counts(await old.settle(0)) == (0, 0, 0)
        assert not await limiter.try_acquire(1), f"after {reset}: 21 permits in one minute"
        await advance(store, clock, 61)


async def test_a_refused_or_released_acquisition_settles_nothing(store: Any) -> None:
    _, limiter = await on_clock(store)
    held = await limiter.reserve(8)
    refused = await limiter.reserve(5)
    assert not refused
    assert counts(await refused.settle(0)) == (0, 0, 0)
    await held.release()
    assert counts(await held.settle(20)) == (0, 0, 0)  # nothing charged either
    assert await limiter.available_permits() == 10


async def test_a_cancelled_settle_goes_on_and_settling_again_returns_its_result(
    store: Any,
) -> None:
    _, limiter = await on_clock(store)
    acquired = await limiter.reserve(6)
    settling = asyncio.ensure_future(acquired.settle(1))
    await asyncio.sleep(0)  # under way
    settling.cancel()
    with pytest.raises(asyncio.CancelledError):
        await settling
    assert counts(await acquired.settle(3)) == (5, 0, 0)  # the cancelled call's, once
    assert await limiter.available_permits() == 9


async def test_a_waiting_reserve_books_nothing_ahead_and_a_cancelled_one_leaves_nothing(
    store: Any,
) -> None:
    _, limiter = await on_clock(store, rates="2/minute")
    assert await limiter.try_acquire(2)
    waiting = asyncio.ensure_future(limiter.reserve(2, timeout=None))
    await asyncio.sleep(0.05)  # (it asks, is refused, and asks again now and then)
    assert not waiting.done()
    # A grant to be settled is not booked behind the others: a newcomer's wait is still
    # the first grant's 60 s, not 120 s.
    assert await limiter.backend.wait_time(limiter.name, 1) == 60e6
    await cancelled(waiting)
    assert await limiter.available_permits() == 0  # nothing of it stays: 0, not -2


async def test_a_settle_for_less_serves_a_waiting_reserve_of_its_process_at_once(
    store: Any,
) -> None:
    _, limiter = await on_clock(store, rates="10/minute")
    first = await limiter.reserve(10)
    waiting = asyncio.ensure_future(limiter.reserve(5, timeout=None))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    settled_at = now()
    await first.settle(1)  # 9 back: the waiting 5 fit now, not in 60 s
    assert await waiting
    tolerance(store).check(now(), settled_at, "the waiting reserve")


async def test_settle_on_a_client_view_settles_that_clients_budget(store: Any) -> None:
    _, limiter = await on_clock(store, rate_type=PER_CLIENT)
    alice, bob = limiter.for_client("alice"), limiter.for_client("bob")
    acquired = await alice.reserve(6)
    assert await bob.try_acquire(3)
    assert counts(await acquired.settle(12)) == (0, 6, 0)
    assert await alice.available_permits() == 0
    assert await bob.available_permits() == 7
    assert not await alice.try_acquire(1)  # alice is in debt; bob is not


async def test_settle_through_a_sharded_limiter_goes_to_the_shard_that_granted(
    store: Any,
) -> None:
    backend = new_client(store, clock=ManualClock())
    limiter = ShardedRateLimiter("llm", backend, shards=2, rate="20/minute")
    acquired = await limiter.reserve(6)
    assert acquired.owners == (limiter,)
    assert counts(await acquired.settle(2, limiter=limiter)) == (4, 0, 0)
    assert counts(await acquired.settle(2)) == (4, 0, 0)  # one limiter: may be omitted
    assert await limiter.available_permits() == 18
    await acquired.release()
    assert await limiter.available_permits() == 20


async def test_after_a_charge_the_binding_rate_holds_later_grants_back(store: Any) -> None:
    clock, limiter = await on_clock(store, rates="10/minute; 12/hour")
    acquired = await limiter.reserve(10)
    assert counts(await acquired.settle(13)) == (0, 3, 0)
    await advance(store, clock, 61)  # the minute has recovered; the hour owes one
    refused = await limiter.reserve(1)
    assert not refused
    assert refused.retry_after > 3000  # the hour binds now


async def test_an_ambiguous_or_unknown_limiter_is_refused(store: Any) -> None:
    _, everyone = await on_clock(store, name="everyone")
    _, per_user = await on_clock(store, rate_type=PER_CLIENT, name="per-user")
    _, other = await on_clock(store, name="other")
    acquired = await acquire_all([(everyone, 2), (per_user.for_client("u1"), 2)])
    with pytest.raises(InvalidArgumentError, match="several limiters"):
        await acquired.settle(1)
    with pytest.raises(InvalidArgumentError, match="is not one"):
        await acquired.settle(1, limiter=other)
    with pytest.raises(InvalidArgumentError, match="is not one"):
        await acquired.settle(1, limiter=per_user.for_client("u2"))
    assert counts(await acquired.settle(1, limiter=per_user.for_client("u1"))) == (1, 0, 0)
    assert counts(await acquired.settle(0, limiter=everyone)) == (2, 0, 0)
    two = await acquire_all([(per_user.for_client("a"), 1), (per_user.for_client("b"), 1)])
    with pytest.raises(InvalidArgumentError, match="several limiters"):
        await two.settle(0)
    with pytest.raises(InvalidArgumentError, match="is not one"):
        await two.settle(0, limiter=per_user)  # which client's? the view says
    assert counts(await two.settle(0, limiter=per_user.for_client("b"))) == (1, 0, 0)


@pytest.mark.parametrize("permits", [-1, True, math.nan, 1.5, "3", None, 2**60])
async def test_bad_settle_permits_are_refused(store: Any, permits: Any) -> None:
    _, limiter = await on_clock(store)
    acquired = await limiter.reserve(2)
    with pytest.raises(InvalidArgumentError, match="permits"):
        await acquired.settle(permits)
    assert counts(await acquired.settle(2)) == (0, 0, 0)  # not settled before: settles now


async def test_a_settle_with_a_cap_settles_then_caps_at_the_providers_count(store: Any) -> None:
    clock, limiter = await on_clock(store)
    acquired = await limiter.reserve(6)
    assert counts(await acquired.settle(2, cap=(3, 30))) == (4, 0, 0)
    assert await limiter.available_permits() == 3  # 8 left after the settle, capped at 3
    await advance(store, clock, 31)
    assert await limiter.available_permits() == 8  # the provider's count has reset
    with pytest.raises(InvalidArgumentError, match="remaining"):
        await (await limiter.reserve(1)).settle(1, cap=(-1, 30))


async def test_a_charge_cut_at_max_debt_is_logged_once_and_observed(
    store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"llm-cut-{store.kind}"  # (said once per process and name)
    _, limiter = await on_clock(store, max_debt=2, name=name)
    cuts = Cuts()
    previous = observe(cuts)
    try:
        with caplog.at_level(logging.WARNING, logger="aiolimit"):
            first, second = await limiter.reserve(5), await limiter.reserve(5)
            assert counts(await first.settle(12)) == (0, 2, 5)
            assert counts(await second.settle(9)) == (0, 0, 4)
    finally:
        observe(previous)
    assert cuts.cuts == [(name, 5), (name, 4)]
    logged = [r for r in caplog.records if "max_debt" in r.getMessage()]
    assert len(logged) == 1


async def test_a_flushed_store_between_reserve_and_settle_settles_nothing(store: Any) -> None:
    _, limiter = await on_clock(store)
    acquired = await limiter.reserve(6)
    backend = store.backend()
    if isinstance(backend, RedisBackend):
        await backend.redis.flushall()
    else:
        await limiter.delete()
    assert counts(await acquired.settle(1)) == (0, 0, 0)
    assert counts(await acquired.settle(20)) == (0, 0, 0)
    await acquired.release()  # nothing to hand back, nothing raised


async def test_max_debt_goes_with_the_rate_of_every_setter(store: Any) -> None:
    backend = new_client(store, clock=ManualClock())
    limiter = RateLimiter("llm", backend, rate="10/minute; max_debt=3")
    assert await limiter.try_acquire(10)
    config = await limiter.get_config()
    assert config is not None and config.max_debt == 3
    await limiter.update_rate(RateLimiterConfig.build(OVERALL, "10/minute", max_debt=4))
    assert (await limiter.get_config()).max_debt == 4  # type: ignore[union-attr]
    sharded = ShardedRateLimiter(
        "sharded",
        backend,
        shards=2,
        rate="20/minute; max_debt=5",
    )
    assert await sharded.try_acquire(1)
    assert [(await s.get_config()).max_debt for s in sharded.shards] == [3, 2]  # type: ignore[union-attr]
    assert (await sharded.get_config()).max_debt == 5  # type: ignore[union-attr]
    with pytest.raises(InvalidArgumentError, match="max_debt"):
        RateLimiter("llm", backend, rate="10/minute; max_debt=-1")
    with pytest.raises(InvalidArgumentError, match="max_debt go with rate"):
        RateLimiter("llm", backend, max_debt=1)


async def test_sync_takes_the_providers_count_as_a_floor(store: Any) -> None:
    clock, limiter = await on_clock(store, rate_type=PER_CLIENT)
    view = limiter.for_client("alice")
    await view.cap_remaining(remaining=3, reset=timedelta(seconds=30))
    assert await view.available_permits() == 3
    assert await limiter.for_client("bob").available_permits() == 10
    await view.cap_remaining(remaining=50, reset=30)  # the provider's newest: it counts none
    assert await view.available_permits() == 10
    await view.cap_remaining(remaining=3, reset=30)
    assert await view.available_permits() == 3
    await advance(store, clock, 31)
    assert await view.available_permits() == 10


async def test_sync_on_a_sharded_limiter_splits_the_count_over_the_shards(store: Any) -> None:
    backend = new_client(store, clock=ManualClock())
    limiter = ShardedRateLimiter("llm", backend, shards=3, rate="30/minute")
    await limiter.cap_remaining(remaining=5, reset=10)
    assert [await s.available_permits() for s in limiter.shards] == [2, 2, 1]


@pytest.mark.parametrize(
    ("remaining", "reset"),
    [(-1, 1), (True, 1), (1.0, 1), (math.nan, 1), (2**60, 1), (1, -1), (1, math.nan), (1, "1")],
)
async def test_sync_refuses_bad_arguments(store: Any, remaining: Any, reset: Any) -> None:
    _, limiter = await on_clock(store)
    with pytest.raises(InvalidArgumentError):
        await limiter.cap_remaining(remaining=remaining, reset=reset)
    assert await limiter.available_permits() == 10
