"""Fixtures for tests on a real Redis Cluster. Use with ``pytest_plugins = ["cluster_fixtures"]``
so every module shares one cluster for the session."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import RedisCluster

from tools.cluster import Cluster, cluster_client, running_cluster


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Cluster]:
    """3 masters + 3 replicas on loopback, for the whole session."""
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
async def cluster_redis(redis_cluster: Cluster) -> AsyncIterator[RedisCluster]:
    """A client of the cluster, which is emptied first (an earlier test may have failed over)."""
    redis_cluster.wait_healthy()
    client = cluster_client(redis_cluster)
    await client.initialize()
    await client.flushall(target_nodes=RedisCluster.PRIMARIES)
    try:
        yield client
    finally:
        await client.aclose()
