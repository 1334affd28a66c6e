"""The limiter on a real Redis Cluster (3 masters + 3 replicas) through ``RedisCluster``.

Limiters with hostile names spread over every master; each keeps all its keys in one slot.
"""

from __future__ import annotations

import asyncio

import pytest
from cluster_keys import HOSTILE_NAMES, masters_holding
from conformance import LoopLag, Tolerance, now
from redis.asyncio import RedisCluster

import aiolimit
from aiolimit import BackendError, RateLimiter, RateLimiterConfig, RateType, RedisBackend
from tools.cluster import Cluster

pytest_plugins = ["cluster_fixtures"]


def test_cluster_runs_three_masters_each_with_a_replica(redis_cluster: Cluster) -> None:
    topology = redis_cluster.topology()
    assert len(topology.masters) == 3
    assert sorted(topology.replicas.values()) == sorted(topology.masters.values())


async def test_hostile_names_spread_over_every_master_each_limiter_on_one(
    redis_cluster: Cluster, cluster_redis: RedisCluster
) -> None:
    backend = RedisBackend(cluster_redis, client_id="c1")
    for name in HOSTILE_NAMES:
        limiter = RateLimiter(name, backend)
        await limiter.set_rate(RateLimiterConfig.build(RateType.PER_CLIENT, 5, 30))
        assert await limiter.try_acquire(2)
        assert await RateLimiter(name, backend.with_client("c2")).try_acquire(1)

    where = masters_holding(redis_cluster)
    masters_used = set()
    for name in HOSTILE_NAMES:
        tag = backend.keys(name).tag
        ports = {port for key, port in where.items() if key.startswith(tag + ":")}
        # config, registry and two clients' value + permits: all on one master
        assert len([key for key in where if key.startswith(tag + ":")]) == 6, name
        assert len(ports) == 1, name
        slots = {
            await cluster_redis.execute_command("CLUSTER KEYSLOT", key)
            for key in where
            if key.startswith(tag + ":")
        }
        assert len(slots) == 1, name
        masters_used |= ports
    assert masters_used == set(redis_cluster.master_ports())


async def test_each_masters_clock_is_mapped_on_its_own(
    redis_cluster: Cluster, cluster_redis: RedisCluster
) -> None:
    # Under clock='server' a limiter's grants are stamped by its master's TIME: a waiter's
    # wake-up maps that master's clock, shared by the limiters it holds and no other's.
    backend = RedisBackend(cluster_redis)
    for name in HOSTILE_NAMES:
        await RateLimiter(name, backend).set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 30))
    where = masters_holding(redis_cluster)
    by_port: dict[int, set[object]] = {}
    for name in HOSTILE_NAMES:
        clock = backend.clock_of(name)
        assert str(clock).endswith(f":{where[backend.keys(name).config]}"), (name, clock)
        by_port.setdefault(where[backend.keys(name).config], set()).add(clock)
    assert len(by_port) == 3 and all(len(clocks) == 1 for clocks in by_port.values())
    client_clock = RedisBackend(cluster_redis, clock="client")
    assert len({client_clock.clock_of(name) for name in HOSTILE_NAMES}) == len(HOSTILE_NAMES)


@pytest.mark.slow
@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
async def test_grants_refuses_releases_and_resets_on_cluster(
    cluster_redis: RedisCluster, name: str
) -> None:
    backend = RedisBackend(cluster_redis)
    limiter = RateLimiter(name, backend)
    assert await limiter.try_set_rate(RateLimiterConfig.build(RateType.OVERALL, 3, 30))
    assert not await limiter.try_set_rate(RateLimiterConfig.build(RateType.OVERALL, 9, 30))
    assert [await limiter.try_acquire() for _ in range(4)] == [True, True, True, False]
    assert await limiter.available_permits() == 0

    await limiter.release(2)
    assert await limiter.available_permits() == 2
    assert await limiter.try_acquire(2)
    assert not await limiter.try_acquire()

    # keep_state: the 3 grants still count against a larger rate
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 30), keep_state=True)
    assert await limiter.available_permits() == 2
    assert await limiter.update_rate(RateLimiterConfig.build(RateType.OVERALL, 4, 30))
    assert await limiter.available_permits() == 1
    # keep_state=False: the budget restarts full
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 4, 30), keep_state=False)
    assert await limiter.available_permits() == 4
    config = await limiter.get_config()
    assert config is not None and config.rate == 4


@pytest.mark.parametrize("name", HOSTILE_NAMES[:4], ids=range(4))
async def test_per_client_budgets_delete_and_expire_on_cluster(
    cluster_redis: RedisCluster, name: str
) -> None:
    alice = RateLimiter(name, RedisBackend(cluster_redis, client_id="alice"))
    bob = RateLimiter(name, RedisBackend(cluster_redis, client_id="bob"))
    await alice.set_rate(RateLimiterConfig.build(RateType.PER_CLIENT, 2, 30))
    assert [await alice.try_acquire() for _ in range(3)] == [True, True, False]
    assert await bob.try_acquire(2)
    assert not await bob.try_acquire()

    assert await alice.expire(30)
    ttls = [
        await cluster_redis.pttl(key) for key in every_key(cluster_redis, name, ["alice", "bob"])
    ]
    existing = [ttl for ttl in ttls if ttl != -2]  # -2: no such key (the OVERALL budget)
    assert len(existing) == 6 and all(0 < ttl <= 30_000 for ttl in existing), ttls
    assert await alice.clear_expire()

    assert await alice.delete()
    assert await alice.get_config() is None
    assert not await bob.delete()
    for key in every_key(
        cluster_redis, name, ["alice", "bob"]
    ):  # one by one: EXISTS of many keys fans out
        assert await cluster_redis.exists(key) == 0


def every_key(redis: RedisCluster, name: str, clients: list[str]) -> list[str]:
    """The config, OVERALL and registry keys of a limiter and each client's value and log."""
    keys = RedisBackend(redis).keys(name)
    return [keys.config, keys.value, keys.permits, keys.registry, *keys.clients(clients)]


@pytest.mark.slow
async def test_waits_exactly_until_a_permit_frees_on_every_master(
    cluster_redis: RedisCluster, loop_lag: LoopLag
) -> None:
    backend = RedisBackend(cluster_redis)
    interval = 0.4
    limiters = [RateLimiter(name, backend) for name in HOSTILE_NAMES]
    for limiter in limiters:
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, interval))
        assert await limiter.try_acquire(2)
    start = now()

    async def wait_one(limiter: RateLimiter) -> float:
        assert await limiter.try_acquire(1, timeout=2)
        return now()

    granted = await asyncio.gather(*(wait_one(limiter) for limiter in limiters))
    # Grants were made just before `start`; each waiter gets its permit when they expire.
    for at in granted:
        Tolerance(0.05, 0.25, loop_lag).check(at, start + interval, "a waiter's grant")
    # fail fast: the wait (~interval) is longer than the timeout, so no sleeping
    assert await limiters[0].try_acquire(2, timeout=0) is False
    before = now()
    assert not await limiters[0].try_acquire(2, timeout=0.1)
    Tolerance(0.0, 0.05, loop_lag).check(now(), before, "the refusal")


async def test_concurrent_callers_on_one_client_never_exceed_the_rate_on_any_master(
    cluster_redis: RedisCluster,
) -> None:
    """Many tasks on one RedisCluster client and several limiters at once, so concurrent
    script calls to different nodes are in flight together."""
    backend = RedisBackend(cluster_redis)
    limiters = [RateLimiter(name, backend) for name in HOSTILE_NAMES]
    for limiter in limiters:
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 7, 30))

    results = await asyncio.gather(
        *(limiter.try_acquire() for limiter in limiters for _ in range(10))
    )
    per_limiter = [sum(results[i * 10 : (i + 1) * 10]) for i in range(len(limiters))]
    assert per_limiter == [7] * len(limiters)
    assert [await limiter.available_permits() for limiter in limiters] == [0] * len(limiters)


async def flush_scripts(cluster: Cluster, ports: list[int]) -> None:
    for port in ports:
        cluster.node(port).command("SCRIPT", "FLUSH")


async def test_recovers_from_script_flush_on_every_node(
    redis_cluster: Cluster, cluster_redis: RedisCluster
) -> None:
    backend = RedisBackend(cluster_redis)
    limiters = [RateLimiter(name, backend) for name in HOSTILE_NAMES]
    for limiter in limiters:
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 4, 30))
        assert await limiter.try_acquire()

    await flush_scripts(redis_cluster, [node.port for node in redis_cluster.nodes])
    for port in redis_cluster.master_ports():
        assert redis_cluster.node(port).command("SCRIPT", "EXISTS", "0" * 40) == [False]
    # one call at a time, then many at once (they may share a round trip per node)
    for limiter in limiters:
        assert await limiter.try_acquire()
    await flush_scripts(redis_cluster, redis_cluster.master_ports())
    granted = await asyncio.gather(*(limiter.try_acquire(2) for limiter in limiters))
    assert granted == [True] * len(limiters)
    assert [await limiter.available_permits() for limiter in limiters] == [0] * len(limiters)

    # every operation reloads its own script
    await flush_scripts(redis_cluster, redis_cluster.master_ports())
    for limiter in limiters:
        await limiter.release(1)
        assert await limiter.available_permits() == 1
        assert await limiter.expire(30)
        assert await limiter.delete()


async def test_recovers_when_only_one_node_lost_its_scripts(
    redis_cluster: Cluster, cluster_redis: RedisCluster
) -> None:
    backend = RedisBackend(cluster_redis)
    limiters = [RateLimiter(name, backend) for name in HOSTILE_NAMES]
    for limiter in limiters:
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, 30))
    await flush_scripts(redis_cluster, redis_cluster.master_ports()[:1])
    assert await asyncio.gather(*(limiter.try_acquire() for limiter in limiters)) == [True] * len(
        limiters
    )


@pytest.mark.slow
async def test_a_node_that_does_not_serve_fails_only_the_limiters_whose_slots_it_holds(
    redis_cluster: Cluster, cluster_redis: RedisCluster
) -> None:
    backend = RedisBackend(cluster_redis, timeout=None)  # (the client's own timeouts alone)
    by_port: dict[int, str] = {}
    for i in range(100):
        name = f"node-{i}"
        by_port.setdefault(cluster_redis.get_node_from_key(backend.keys(name).tag).port, name)
    (_, healthy_name), (failing_port, failing_name) = list(by_port.items())[:2]
    healthy, failing = RateLimiter(healthy_name, backend), RateLimiter(failing_name, backend)
    for limiter in (healthy, failing):
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1000, 1))
    node = redis_cluster.node(failing_port)
    node.command("CLIENT", "PAUSE", "30000", "WRITE")  # its writes wait: every call times out
    try:
        with pytest.raises(BackendError) as caught:
            await aiolimit.acquire_all([(healthy, 1), (failing, 1)])  # one round trip
        assert caught.value.outage
        assert aiolimit.breaker_of(backend, failing_name).is_open
        assert not aiolimit.breaker_of(backend, healthy_name).is_open
        assert await healthy.try_acquire()
    finally:
        node.command("CLIENT", "UNPAUSE")


@pytest.mark.parametrize("algorithm", ["sliding_window", "token_bucket", "fixed_window"])
async def test_reserve_settle_and_sync_on_cluster_each_in_its_limiters_slot(
    redis_cluster: Cluster, cluster_redis: RedisCluster, algorithm: str
) -> None:
    """Token budgets on a cluster: an ``acquire_all`` of limiters on different masters, each
    settled (fewer, more), a PER_CLIENT view settled, and a sync: one script call each, in the
    limiter's own slot (a cross-slot script would be refused by the cluster)."""
    backend = RedisBackend(cluster_redis, client_id="worker-1")
    names = [f"llm-{algorithm}-{n}" for n in range(6)]  # spread over the masters
    limiters = [RateLimiter(name, backend) for name in names]
    for limiter in limiters:
        await limiter.set_rate(
            RateLimiterConfig.build(RateType.OVERALL, 1000, 60, algorithm=algorithm)
        )
    acquired = await aiolimit.acquire_all([(limiter, 600) for limiter in limiters])
    assert acquired
    where = masters_holding(redis_cluster)
    tags = [backend.keys(name).tag + ":" for name in names]
    masters = {port for key, port in where.items() if any(key.startswith(t) for t in tags)}
    assert len(masters) >= 2, masters  # (the acquisition spans masters)
    for number, limiter in enumerate(limiters):
        used = 100 if number % 2 else 700  # fewer: 500 back; more: 100 charged
        settled = await acquired.settle(used, limiter=limiter)
        assert (settled.handed_back, settled.charged) == ((500, 0) if used == 100 else (0, 100))
        assert await limiter.available_permits() == 1000 - used
    again = await acquired.settle(1, limiter=limiters[0])  # a second settle: the first result
    assert (again.handed_back, again.charged) == (0, 100)

    per_client = RateLimiter(f"llm-{algorithm}-users", backend)
    await per_client.set_rate(
        RateLimiterConfig.build(RateType.PER_CLIENT, 50, 60, algorithm=algorithm)
    )
    alice = per_client.for_client("alice")
    reserved = await alice.reserve(40)
    assert reserved and (await reserved.settle(10)).handed_back == 30
    assert await alice.available_permits() == 40

    await limiters[1].cap_remaining(remaining=300, reset=20)
    left = await limiters[1].available_permits()
    # (a token bucket cannot hold "300 now, no more until the reset": it refills to 300 by
    # then from empty, which keeps the floor too; fixed windows hold it whether the reset
    # falls in the current window or, on the real clock here one time in three, past it)
    assert left == 300 if algorithm != "token_bucket" else 0 <= left <= 300
