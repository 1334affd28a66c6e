"""``limiter.pause(duration)`` on every backend: no grant to anyone before it ends, reservations
made before it move behind it, and ``delete``/``set_rate`` clear it."""

from __future__ import annotations

import asyncio
import math

import pytest
from conformance import check_after, new_client, now, tolerance, when_free

from aiolimit import (
    Algorithm,
    InvalidArgumentError,
    NotConfiguredError,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    ShardedRateLimiter,
)

OVERALL, PER_CLIENT = RateType.OVERALL, RateType.PER_CLIENT


async def configured(store, name, rate, interval, rate_type=OVERALL, **options):
    limiter = RateLimiter(name, store.backend())
    await limiter.set_rate(RateLimiterConfig.build(rate_type, rate, interval, **options))
    return limiter


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", list(Algorithm))
async def test_no_grant_starts_before_the_block_ends(store, name, algorithm):
    limiter = await configured(store, name, 5, 1, algorithm=algorithm)
    before = now()
    await limiter.pause(0.6)
    blocked = before, now()  # the store read its clock within the call
    assert not await limiter.try_acquire(), "granted inside the block"
    assert await limiter.available_permits() == 0
    free = await when_free(limiter)
    tolerance(store).check_span(free, (blocked[0] + 0.6, blocked[1] + 0.6), "the block's end")
    assert await limiter.try_acquire(timeout=1)
    check_after(store, blocked, 0.6, "the first grant after the block")


async def test_a_block_holds_back_every_client_of_a_per_client_limiter(store, name):
    limiter = await configured(store, name, 5, 1, PER_CLIENT)
    other = RateLimiter(name, new_client(store, "other"))
    await limiter.pause(5)
    assert not await limiter.try_acquire()
    assert not await other.try_acquire()


@pytest.mark.slow
async def test_reservations_made_before_a_block_move_behind_it(store, name, asleep):
    limiter = await configured(store, name, 2, 0.5)
    assert await limiter.try_acquire(2)
    waiter = asyncio.create_task(limiter.acquire())  # reserved 0.5 s after the grant
    await asleep.reach(name, 1)  # the waiter holds its reservation
    before = now()
    await limiter.pause(1.0)  # later than the reservation
    blocked = before, now()  # the store read its clock within the call
    await waiter
    tol = tolerance(store)
    assert now() >= blocked[0] + 1.0 - tol.early, "a reservation made before the block ran in it"
    check_after(store, blocked, 1.0, "the moved reservation")


@pytest.mark.slow
async def test_a_block_in_another_process_moves_this_ones_reservations(store, name, asleep):
    limiter = await configured(store, name, 2, 0.5)
    assert await limiter.try_acquire(2)
    other = RateLimiter(name, new_client(store))
    waiter = asyncio.create_task(limiter.acquire())  # reserved 0.5 s after the grant
    await asleep.reach(name, 1)  # the waiter holds its reservation
    start = now()
    await other.pause(0.2)  # once blocked, this limiter's sleepers look when they wake
    await other.pause(1.0)
    await waiter
    assert now() >= start + 1.0 - tolerance(store).early


async def test_a_shorter_block_never_shortens_a_longer_one(store, name):
    limiter = await configured(store, name, 5, 1)
    await limiter.pause(30)
    await limiter.pause(1)
    assert await limiter.wait_time() > 28


async def test_delete_and_set_rate_clear_a_block(store, name):
    limiter = await configured(store, name, 5, 1)
    await limiter.pause(30)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 5, 1))
    assert await limiter.try_acquire()
    await limiter.pause(30)
    await limiter.delete()
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 5, 1))
    assert await limiter.try_acquire()


async def test_a_sharded_limiter_blocks_every_shard(store, name):
    limiter = ShardedRateLimiter(name, store.backend(), shards=3)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 30, 1))
    await limiter.pause(5)
    assert not await limiter.try_acquire()


async def test_block_checks_its_argument_and_needs_a_config(store, name):
    limiter = RateLimiter(name, store.backend())
    with pytest.raises(NotConfiguredError):
        await limiter.pause(1)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 5, 1))
    for bad in (-1, math.nan, math.inf, "1", None):
        with pytest.raises(InvalidArgumentError):
            await limiter.pause(bad)
    assert await limiter.try_acquire()  # nothing was blocked


@pytest.mark.slow
async def test_a_block_set_elsewhere_stops_a_reservation_made_before_any_block(store, name, asleep):
    # A block from another process (the CLI) must stop the reservations made before it:
    # 14 tasks on 10/second and a 3 s block would otherwise see 14 grants during the block, if
    # only a process that had itself blocked looked again on waking. Here the block comes
    # through another client's backend, as from another process.
    limiter = await configured(store, name, 2, 0.5)
    assert await limiter.try_acquire(2)
    waiter = asyncio.create_task(limiter.acquire())  # reserved 0.5 s on, never blocked
    await asleep.reach(name, 1)  # the waiter holds its reservation
    start = now()
    assert await new_client(store).block(name, 1_000_000) > 0  # until start + 1.0
    await waiter
    assert now() >= start + 1.0 - tolerance(store).early, "granted inside the block"


async def test_unblock_ends_a_block_at_once_in_every_process(store, name):
    limiter = await configured(store, name, 5, 1)
    other = RateLimiter(name, new_client(store, "other"))
    await limiter.pause(30)
    assert not await other.try_acquire()
    assert await other.resume()
    assert await limiter.try_acquire()
    assert await other.try_acquire()
    assert not await limiter.resume(), "no block left to end"
    await limiter.pause(0)
    assert not await limiter.resume(), "a block that has ended is none"


async def test_block_left_says_how_long_a_block_has_left(store, name):
    limiter = await configured(store, name, 5, 1)
    backend = store.backend()
    assert await backend.block_left(name) == 0
    assert await backend.blocked_until(name) is None
    await limiter.pause(2)
    assert 1_500_000 < await backend.block_left(name) <= 2_000_000
    until = await backend.blocked_until(name)
    grant = await backend.try_acquire(name, 1, None)  # a reservation behind the block
    assert grant.granted and grant.blocked_until == until == grant.starts_at
    await limiter.resume()
    assert await backend.block_left(name) == 0
    assert await backend.blocked_until(name) is None
    with pytest.raises(NotConfiguredError):
        await backend.block_left("never-configured")
    with pytest.raises(NotConfiguredError):
        await RateLimiter("never-configured", backend).resume()


async def test_a_sharded_limiter_unblocks_every_shard(store, name):
    limiter = ShardedRateLimiter(name, store.backend(), shards=3)
    await limiter.set_rate(RateLimiterConfig.build(OVERALL, 30, 1))
    await limiter.pause(5)
    assert await limiter.resume()
    assert await limiter.try_acquire(10)
    assert await limiter.available_permits() == 20
