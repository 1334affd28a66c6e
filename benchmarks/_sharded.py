"""``throughput.py --sharded``: grants per second of a ShardedRateLimiter with K = 1, 2, 3
shards on a local 3-master cluster.

Starts a Redis Cluster (3 masters + 3 replicas) on free loopback ports with the lab's
harness (``tools/cluster.py``), runs ``processes`` x ``workers`` clients (each its own
connection, one call at a time) taking single permits from a limiter whose rate is never
the limit, and prints a table. The cluster is stopped at the end.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time

from _harness import Table

from aiolimit import RateLimiterConfig, RateType, RedisBackend, ShardedRateLimiter
from tools.cluster import Cluster, cluster_client, running_cluster

NAME = "bench {sharded}"


async def _grants(url_port: int, shards: int, workers: int, seconds: float) -> int:
    from redis.asyncio import RedisCluster

    clients = [
        RedisCluster(host="127.0.0.1", port=url_port, socket_timeout=5) for _ in range(workers)
    ]
    stop = time.monotonic() + seconds
    counts = [0] * workers

    async def worker(i: int) -> None:
        limiter = ShardedRateLimiter(NAME, RedisBackend(clients[i]), shards=shards)
        while time.monotonic() < stop:
            if await limiter.try_acquire():
                counts[i] += 1

    try:
        await asyncio.gather(*(worker(i) for i in range(workers)))
    finally:
        for client in clients:
            await client.aclose()
    return sum(counts)


def _process(
    port: int, shards: int, workers: int, seconds: float, out: multiprocessing.Queue
) -> None:  # type: ignore[type-arg]
    out.put(asyncio.run(_grants(port, shards, workers, seconds)))


async def _configure(cluster: Cluster, shards: int, interval: float) -> None:
    client = cluster_client(cluster)
    try:
        limiter = ShardedRateLimiter(NAME, RedisBackend(client), shards=shards)
        await limiter.delete()
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 100_000_000, interval))
    finally:
        await client.aclose()


def measure(
    cluster: Cluster, shards: int, processes: int, workers: int, seconds: float, interval: float
) -> float:
    asyncio.run(_configure(cluster, shards, interval))
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    procs = [
        multiprocessing.Process(
            target=_process, args=(cluster.nodes[0].port, shards, workers, seconds, out)
        )
        for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    total = sum(out.get(timeout=seconds + 60) for _ in procs)
    for proc in procs:
        proc.join(10)
    return total / seconds


def sharded(processes: int, workers: int, seconds: float, interval: float) -> Table:
    """Grants/s with K = 1, 2, 3 shards, and each against K = 1."""
    out = Table(["shards", "grants/s", "vs K=1"])
    with running_cluster() as cluster:
        base = None
        for shards in (1, 2, 3):
            rate = measure(cluster, shards, processes, workers, seconds, interval)
            base = base or rate
            out.add(shards, f"{rate:,.0f}", f"{rate / base:.2f}")
    return out
