"""ShardedRateLimiter: one rate split over sub-limiters on different slots / masters.

Memory-backend tests run on virtual time (looptime); cluster tests on the real cluster.
"""

from __future__ import annotations

import asyncio

import pytest
from cluster_keys import HOSTILE_NAMES, masters_holding
from conformance import ManualClock
from recording import GrantRecord, RecordingBackend
from redis.asyncio import RedisCluster

from aiolimit import (
    BackendError,
    InvalidArgumentError,
    MemoryBackend,
    NotConfiguredError,
    RateLimiterConfig,
    RateType,
    RedisBackend,
    ShardedRateLimiter,
)
from aiolimit.backends import Attempt
from tools import busiest_window
from tools.cluster import Cluster, cluster_client

pytest_plugins = ["cluster_fixtures"]


# -- splitting -------------------------------------------------------------------------------


async def split_rate(rate: int, shards: int) -> list[int]:
    """The shard budgets a ShardedRateLimiter gives a rate."""
    limiter = ShardedRateLimiter("split", MemoryBackend(), shards=shards)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, rate, 60))
    configs = [await shard.get_config() for shard in limiter.shards]
    return [config.rate for config in configs if config is not None]


@pytest.mark.parametrize(
    ("rate", "shards", "budgets"),
    [
        (10, 3, [4, 3, 3]),
        (9, 3, [3, 3, 3]),
        (3, 3, [1, 1, 1]),
        (7, 1, [7]),
        (101, 4, [26, 25, 25, 25]),
    ],
)
async def test_split_rate_sums_to_the_rate_with_the_remainder_spread(
    rate: int, shards: int, budgets: list[int]
) -> None:
    assert await split_rate(rate, shards) == budgets
    assert sum(await split_rate(rate, shards)) == rate


async def test_split_rate_never_exceeds_either_rate_while_a_change_is_applied_shard_by_shard() -> (
    None
):
    for shards in (2, 3, 5):
        budgets = {rate: await split_rate(rate, shards) for rate in range(shards, 40)}
        for old in range(shards, 40):
            for new in range(shards, 40):
                pairs = zip(budgets[old], budgets[new], strict=True)
                mixed = [max(a, b) for a, b in pairs]
                assert sum(mixed) == max(old, new)


async def test_a_rate_below_the_shard_count_is_refused_with_a_clear_error() -> None:
    limiter = ShardedRateLimiter("small", MemoryBackend(), shards=3)
    with pytest.raises(ValueError, match="cannot be split over 3 shards"):
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, 1))
    assert await limiter.get_config() is None


@pytest.mark.parametrize("shards", [0, -1, True, 2.0, 257])
def test_invalid_shard_counts_are_refused(shards: object) -> None:
    with pytest.raises(ValueError, match="shards"):
        ShardedRateLimiter("x", MemoryBackend(), shards=shards)  # type: ignore[arg-type]


# -- what a sharded limiter cannot keep ---------------------------------------------------------


async def test_min_spacing_is_refused_at_every_set_rate_entry_and_nothing_is_written(
    store, name
) -> None:
    # One spacing across shards would need one shared key: each shard keeps only its own, so
    # grants of different shards may start together. The limiter refuses it, naming why.
    limiter = ShardedRateLimiter(name, store.backend(), shards=3)
    entries = [
        limiter.try_set_rate,
        limiter.set_rate,
        limiter.ensure_rate,
        limiter.update_rate,
    ]
    for entry in entries:
        with pytest.raises(InvalidArgumentError, match=r"min_spacing.*ShardedRateLimiter"):
            await entry(RateLimiterConfig.build(RateType.OVERALL, 30, 1, min_spacing=0.1))
    assert await limiter.get_config() is None
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 30, 1))
    stored = await limiter.get_config()
    with pytest.raises(InvalidArgumentError, match="min_spacing"):
        await limiter.update_rate(RateLimiterConfig.build(RateType.OVERALL, 60, 1, min_spacing=0.1))
    assert await limiter.get_config() == stored
    assert stored is not None and stored.min_spacing is None
    assert all([await limiter.try_acquire() for _ in range(4)])  # no spacing applied


async def test_a_zero_min_spacing_is_no_spacing_and_is_accepted(store, name) -> None:
    limiter = ShardedRateLimiter(name, store.backend(), shards=2)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 10, 1, min_spacing=0))
    config = await limiter.get_config()
    assert config is not None and config.min_spacing is None


# -- shard names and slots -------------------------------------------------------------------


class _NoServer:
    """Stands in for a Redis client: shard names only need the key layout."""


def shard_names(name: str, shards: int, backend: RedisBackend) -> list[str]:
    return [shard.name for shard in ShardedRateLimiter(name, backend, shards=shards).shards]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
def test_shard_names_are_deterministic_and_spread_over_the_slot_space(name: str) -> None:
    backend = RedisBackend(_NoServer())
    for shards in (2, 3, 4, 8):
        names = shard_names(name, shards, backend)
        assert names == shard_names(name, shards, RedisBackend(_NoServer(), prefix="other:"))
        assert all(n.startswith(f"{name}\x00shard{i}") for i, n in enumerate(names))
        slots = [backend.slot(n) for n in names]
        # shard i lies in the i-th of `shards` equal parts of the slot space
        assert [slot * shards // 16384 for slot in slots] == list(range(shards)), slots
    # three shards fall in the three ranges redis-cli gives three masters
    slots = [backend.slot(n) for n in shard_names(name, 3, backend)]
    assert [0 <= slots[0] <= 5460, 5461 <= slots[1] <= 10922, slots[2] >= 10923] == [True] * 3


def test_memory_shards_are_plainly_named() -> None:
    limiter = ShardedRateLimiter("api", MemoryBackend(), shards=2)
    assert [shard.name for shard in limiter.shards] == ["api\x00shard0", "api\x00shard1"]


# -- behaviour on the memory backend (virtual time) ------------------------------------------

looptime = pytest.mark.looptime


@looptime
async def test_grants_the_whole_rate_across_shards_before_refusing() -> None:
    limiter = ShardedRateLimiter("api", MemoryBackend(), shards=3)
    assert await limiter.try_set_rate(RateLimiterConfig.build(RateType.OVERALL, 10, 60))
    assert not await limiter.try_set_rate(RateLimiterConfig.build(RateType.OVERALL, 99, 60))
    config = await limiter.get_config()
    assert config is not None and config.rate == 10
    assert [(await s.get_config()).rate for s in limiter.shards] == [4, 3, 3]  # type: ignore[union-attr]

    # timeout=0 falls back to the other shards: every permit is found
    assert [await limiter.try_acquire() for _ in range(11)] == [True] * 10 + [False]
    assert await limiter.available_permits() == 0
    assert [await s.available_permits() for s in limiter.shards] == [0, 0, 0]


@looptime
async def test_a_request_is_served_by_one_shard_only() -> None:
    limiter = ShardedRateLimiter("api", MemoryBackend(), shards=2)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 11, 60))  # budgets 6 and 5
    with pytest.raises(ValueError, match="exceed every shard's budget"):
        await limiter.try_acquire(7)
    assert await limiter.try_acquire(6)  # only the first shard can
    assert not await limiter.try_acquire(6)
    assert await limiter.try_acquire(3)
    # 2 left on one shard, nothing on the other: free permits do not add up
    assert await limiter.available_permits() == 2
    assert not await limiter.try_acquire(3)
    assert await limiter.try_acquire(2)


@looptime
async def test_waits_exactly_for_the_shard_that_frees_first() -> None:
    limiter = ShardedRateLimiter("api", MemoryBackend(), shards=3)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 3, 10))
    loop = asyncio.get_running_loop()
    first = loop.time()
    for _ in range(3):
        assert await limiter.try_acquire()
        await asyncio.sleep(1)
    # the first grant frees at first + 10: later than a 5 s timeout, so refused at once
    assert not await limiter.try_acquire(timeout=5)
    assert loop.time() == pytest.approx(first + 3)
    assert await limiter.try_acquire(timeout=8)
    assert loop.time() == pytest.approx(first + 10, abs=0.01)
    assert await limiter.try_acquire(timeout=None)
    assert loop.time() == pytest.approx(first + 11, abs=0.01)


@looptime
async def test_concurrent_waiters_never_exceed_the_rate_in_any_window() -> None:
    backend = MemoryBackend()
    limiter = ShardedRateLimiter("api", backend, shards=3)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 7, 1))
    loop = asyncio.get_running_loop()
    grants: list[float] = []

    async def worker(permits: int) -> None:
        for _ in range(6):
            await limiter.acquire(permits)
            grants.append(loop.time())

    # permits 1 or 2 (the smallest shard budget is 2)
    await asyncio.wait_for(asyncio.gather(*(worker(1 + i % 2) for i in range(6))), timeout=60)
    assert len(grants) == 36
    assert busiest_window(grants, 1.0).most <= 7


@looptime
async def test_release_update_expire_and_delete_reach_every_shard() -> None:
    limiter = ShardedRateLimiter("api", MemoryBackend(), shards=2)
    with pytest.raises(NotConfiguredError):
        await limiter.try_acquire()
    assert not await limiter.update_rate(RateLimiterConfig.build(RateType.OVERALL, 4, 60))
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 4, 60))
    assert [await limiter.try_acquire() for _ in range(4)] == [True] * 4
    await limiter.release(3)
    assert await limiter.available_permits() == 3

    # keep_state: the one grant still counts after raising the rate to 6 (3 per shard)
    assert await limiter.update_rate(RateLimiterConfig.build(RateType.OVERALL, 6, 60))
    assert await limiter.available_permits() == 5
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 6, 60), keep_state=False)
    assert await limiter.available_permits() == 6

    assert await limiter.expire(30)
    assert await limiter.clear_expire()
    assert await limiter.delete()
    assert await limiter.get_config() is None
    assert not await limiter.delete()


@looptime
async def test_per_client_budgets_are_split_too() -> None:
    backend = MemoryBackend(client_id="a")
    alice = ShardedRateLimiter("api", backend, shards=2)
    bob = ShardedRateLimiter("api", backend.with_client("b"), shards=2)
    await alice.set_rate(RateLimiterConfig.build(RateType.PER_CLIENT, 4, 60))
    assert [await alice.try_acquire() for _ in range(5)] == [True] * 4 + [False]
    assert [await bob.try_acquire() for _ in range(5)] == [True] * 4 + [False]


@looptime
async def test_a_shard_whose_backend_fails_is_skipped_until_none_answers() -> None:
    down: set[str] = set()

    class PartlyDown(MemoryBackend):
        async def try_acquire(
            self, name: str, permits: int, max_wait_us: int | None = 0
        ) -> Attempt:
            if name in down:
                raise BackendError(f"{name} is down")
            return await super().try_acquire(name, permits, max_wait_us)

    limiter = ShardedRateLimiter("api", PartlyDown(), shards=3)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 6, 60))
    down.add(limiter.shards[0].name)
    assert [await limiter.try_acquire() for _ in range(5)] == [True] * 4 + [False]
    down.update(shard.name for shard in limiter.shards)
    with pytest.raises(BackendError, match="is down"):
        await limiter.try_acquire()


@looptime
async def test_async_with_takes_one_permit() -> None:
    limiter = ShardedRateLimiter("api", MemoryBackend(), shards=2)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, 60))
    async with limiter, limiter:
        assert await limiter.available_permits() == 0


# -- on the real cluster ---------------------------------------------------------------------


def masters_of(cluster: Cluster, backend: RedisBackend, limiter_name: str) -> set[int]:
    tag = backend.keys(limiter_name).tag + ":"
    return {port for key, port in masters_holding(cluster).items() if key.startswith(tag)}


@pytest.mark.parametrize("shards", [2, 3])
async def test_shards_land_on_different_masters(
    redis_cluster: Cluster, cluster_redis: RedisCluster, shards: int
) -> None:
    backend = RedisBackend(cluster_redis)
    for name in HOSTILE_NAMES[:5]:
        limiter = ShardedRateLimiter(name, backend, shards=shards)
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 30, 30))
        masters = [masters_of(redis_cluster, backend, s.name) for s in limiter.shards]
        assert all(len(m) == 1 for m in masters), masters
        assert len(set.union(*masters)) == shards, (name, masters)


async def test_independent_clients_never_exceed_the_rate_across_shards_on_the_cluster(
    redis_cluster: Cluster, cluster_redis: RedisCluster
) -> None:
    """Three clients (own connections) share a 3-shard limiter for 3 intervals of the
    limiter's clock, all trying at once at every quarter of an interval; the grant times never
    put more than the rate in one window, and the rate is used. The clock moves only when the
    test moves it, so a slow round trip on a busy machine cannot leave a budget unused (and
    the interval is long, so that the servers keep the keys on their own clocks)."""
    rate, interval, intervals = 12, 40, 3
    name = "shared {api}"
    clock = ManualClock()
    await ShardedRateLimiter(name, RedisBackend(cluster_redis, clock=clock), shards=3).set_rate(
        RateLimiterConfig.build(RateType.OVERALL, rate, interval)
    )
    clients = [cluster_client(redis_cluster) for _ in range(3)]
    grants: list[GrantRecord] = []
    limiters = [
        ShardedRateLimiter(name, RecordingBackend(redis, grants, clock=clock), shards=3)
        for redis in clients
    ]

    async def attempts(limiter: ShardedRateLimiter) -> None:
        for _ in range(rate):
            await limiter.try_acquire(1)

    try:
        for _ in range(4 * intervals):
            await asyncio.wait_for(asyncio.gather(*(attempts(x) for x in limiters)), timeout=60)
            clock.advance(interval / 4)
    finally:
        for client in clients:
            await client.aclose()
    # integer microseconds: a grant exactly one interval after another does not overlap it
    assert busiest_window([g.time for g in grants], round(interval * 1e6)).most <= rate
    assert len(grants) == intervals * rate  # the shards' budgets all get used
