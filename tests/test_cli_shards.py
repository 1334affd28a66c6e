"""The admin commands on what a glob or a name finds beside plain limiters: a
``ShardedRateLimiter``'s shards (deleted and inspected as one limiter), keys that only look
like a limiter's config (never listed), and a limiter whose delete fails (reported; the
others are deleted all the same). Against a real redis-server.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import redis as sync_redis
from commands import aiolimit, field, limiters_on, on_server
from redis.asyncio import RedisCluster

from aiolimit import RateLimiter, RateLimiterConfig, RateType, RedisBackend, ShardedRateLimiter
from tools import free_port
from tools.cluster import Cluster, cluster_client

pytest_plugins = ["cluster_fixtures"]


def _prefix() -> str:
    return f"shards{free_port()}:"


async def _sharded(
    backend: RedisBackend, name: str, shards: int = 3, rate: int = 10
) -> ShardedRateLimiter:
    limiter = ShardedRateLimiter(name, backend, shards=shards)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, rate, 60))
    return limiter


def test_a_glob_deletes_a_sharded_limiter_s_every_shard_and_the_plain_ones(capsys, url):
    prefix = _prefix()

    async def make(backend: RedisBackend) -> None:
        await RateLimiter("api-plain", backend).set_rate(
            RateLimiterConfig.build(RateType.OVERALL, 1, 1)
        )
        await _sharded(backend, "api-sharded")
        await RateLimiter("other", backend).set_rate(
            RateLimiterConfig.build(RateType.OVERALL, 1, 1)
        )

    on_server(url, make, prefix)
    code, out, err = aiolimit(capsys, url, "delete", "api-*", "--yes", "--prefix", prefix)
    assert (code, err) == (0, "")
    assert out == (
        "2 limiters match 'api-*':\n"
        "  api-plain\n"
        "  api-sharded (sharded: 3 shards)\n"
        "deleted api-plain\n"
        "deleted api-sharded (sharded: 3 shards)\n"
        "2 limiters deleted\n"
    )
    assert limiters_on(url, prefix) == ["other"]


def test_a_glob_matches_a_sharded_limiter_by_its_name_not_its_shards(capsys, url):
    prefix = _prefix()
    on_server(url, lambda backend: _sharded(backend, "search"), prefix)
    # "*h" matches the name "search", though no shard's stored name ends in "h"
    code, out, _ = aiolimit(capsys, url, "delete", "*h", "--yes", "--prefix", prefix)
    assert code == 0
    assert out.splitlines()[:2] == ["1 limiter matches '*h':", "  search (sharded: 3 shards)"]
    assert limiters_on(url, prefix) == []


def test_delete_by_name_deletes_a_sharded_limiter(capsys, url):
    prefix = _prefix()
    on_server(url, lambda backend: _sharded(backend, "search", shards=2), prefix)
    code, out, err = aiolimit(capsys, url, "delete", "search", "--prefix", prefix)
    assert (code, out, err) == (0, "deleted search (sharded: 2 shards)\n", "")
    assert limiters_on(url, prefix) == []


def test_one_limiter_that_fails_to_delete_is_reported_and_the_others_are_deleted(capsys, url):
    prefix = _prefix()

    async def make(backend: RedisBackend) -> None:
        for each in ("job-a", "job-b", "job-c"):
            await RateLimiter(each, backend).set_rate(
                RateLimiterConfig.build(RateType.OVERALL, 1, 1)
            )
        await _sharded(backend, "job-s")
        # job-b's clients registry holds foreign data: its delete fails (WRONGTYPE)
        await backend.redis.set(backend.keys("job-b").registry, "not a registry")

    on_server(url, make, prefix)
    code, out, err = aiolimit(capsys, url, "delete", "job-*", "--yes", "--prefix", prefix)
    assert code == 2
    assert out.splitlines()[-4:] == [
        "deleted job-a",
        "deleted job-c",
        "deleted job-s (sharded: 3 shards)",
        "3 limiters deleted, 1 not",
    ]
    assert err.startswith("aiolimit delete: error: job-b not deleted: ")
    assert len(err.splitlines()) == 1
    assert limiters_on(url, prefix) == []  # (job-b's config went before its registry failed)


def test_inspect_shows_a_sharded_limiter_summed_over_its_shards(capsys, url):
    prefix = _prefix()

    async def make(backend: RedisBackend) -> None:
        limiter = await _sharded(backend, "search")
        for _ in range(4):
            assert await limiter.try_acquire()

    on_server(url, make, prefix)
    code, out, err = aiolimit(capsys, url, "inspect", "search", "--prefix", prefix)
    assert (code, err) == (0, "")
    assert field(out, "limiter") == "search (sharded: 3 shards)"
    assert field(out, "rates") == "10/minute (SLIDING_WINDOW, OVERALL), summed over the shards"
    assert field(out, "available") == "6 of 10 permits now, summed over the shards"
    assert field(out, "grants") == "4 since the state began"
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("shards"))
    rows = [line.split() for line in lines[header + 1 : header + 4]]
    assert [re.sub(r"\.\d+$", "", row[0]) for row in rows] == [
        f"search\\0shard{i}" for i in range(3)
    ]  # (on a store with slots, a shard's name may end in .<n>: _sharded._shard_names)
    assert [row[1] for row in rows] == ["4/minute", "3/minute", "3/minute"]
    assert sum(int(row[2]) for row in rows) == 6  # (the grants went round robin from any shard)
    code, out, _ = aiolimit(capsys, url, "inspect", "search", "--json", "--prefix", prefix)
    shown = json.loads(out)
    assert shown["name"] == "search"
    assert shown["config"]["rates"] == ["10/minute"]
    assert shown["available"] == 6
    names = [re.sub(r"\.\d+$", "", shard["name"]) for shard in shown["shards"]]
    assert names == [f"search\x00shard{i}" for i in range(3)]
    assert sum(shard["available"] for shard in shown["shards"]) == 6
    assert shown["grants"] == sum(shard["grants"] for shard in shown["shards"]) == 4


def test_list_shows_a_sharded_limiter_once_with_its_rate_summed(capsys, url):
    prefix = _prefix()

    async def make(backend: RedisBackend) -> None:
        await _sharded(backend, "search", shards=12, rate=12)
        await RateLimiter("plain", backend).set_rate(
            RateLimiterConfig.build(RateType.OVERALL, 5, 1)
        )

    on_server(url, make, prefix)
    code, out, _ = aiolimit(capsys, url, "list", "--prefix", prefix)
    assert code == 0
    assert out.splitlines() == [
        "plain   5/second   SLIDING_WINDOW  OVERALL",
        "search  12/minute  SLIDING_WINDOW  OVERALL  sharded: 12 shards",
    ]


# -- keys that only look like a limiter's config ---------------------------------------------


def test_a_client_id_ending_in_config_is_never_listed_as_a_limiter(capsys, url):
    prefix = _prefix()

    async def make(backend: RedisBackend) -> None:
        await RateLimiter("api", backend).set_rate(
            RateLimiterConfig.build(RateType.PER_CLIENT, 5, 60)
        )
        for client in ("x}:config", "{evil}:config", "%7D:config"):
            assert await RateLimiter("api", backend).for_client(client).try_acquire()

    on_server(url, make, prefix)
    assert limiters_on(url, prefix) == ["api"]
    code, out, _ = aiolimit(capsys, url, "list", "--prefix", prefix)
    assert (code, out) == (0, "api  5/minute  SLIDING_WINDOW  PER_CLIENT\n")
    code, out, _ = aiolimit(capsys, url, "delete", "*", "--yes", "--prefix", prefix)
    assert code == 0
    assert out.splitlines()[:2] == ["1 limiter matches '*':", "  api"]


def test_keys_that_are_no_limiter_s_config_hash_are_never_listed(capsys, url):
    prefix = _prefix()
    make = lambda backend: RateLimiter("real", backend).set_rate("1/second")  # noqa: E731
    on_server(url, make, prefix)
    with sync_redis.Redis.from_url(url) as admin:
        admin.set(f"{prefix}{{a-string}}:config", "x")  # not a hash
        admin.hset(f"{prefix}{{no-fields}}:config", "owner", "someone else")  # not a config
        admin.hset(f"{prefix}{{bad%zz}}:config", mapping={"rate": 1, "interval": 1, "type": "x"})
        admin.hset(f"{prefix}{{two}}{{tags}}:config", mapping={"rate": 1, "interval": 1})
        admin.hset(b"%b{\xff\xfe}:config" % prefix.encode(), "rate", 1)  # not UTF-8
    assert limiters_on(url, prefix) == ["real"]
    code, out, err = aiolimit(capsys, url, "list", "--prefix", prefix)
    assert (code, out, err) == (0, "real  1/second  SLIDING_WINDOW  OVERALL\n", "")
    code, out, err = aiolimit(capsys, url, "delete", "*", "--yes", "--prefix", prefix)
    assert (code, err) == (0, "")
    assert out.splitlines()[:2] == ["1 limiter matches '*':", "  real"]


@pytest.mark.slow
def test_a_sharded_limiter_on_a_cluster_is_inspected_and_deleted_on_every_master(
    capsys, redis_cluster: Cluster, name
):
    async def make() -> None:
        redis = cluster_client(redis_cluster)
        try:
            await redis.initialize()
            await redis.flushall(target_nodes=RedisCluster.PRIMARIES)
            await _sharded(RedisBackend(redis), name)
        finally:
            await redis.aclose()

    redis_cluster.wait_healthy()
    asyncio.run(make())
    url = redis_cluster.url
    code, out, err = aiolimit(capsys, url, "inspect", name, "--cluster", "--json")
    assert (code, err) == (0, "")
    shards = json.loads(out)["shards"]
    assert len({shard["node"] for shard in shards}) == 3  # a shard on each master
    code, out, err = aiolimit(capsys, url, "delete", f"{name[:3]}*", "--yes", "--cluster")
    assert (code, err) == (0, "")
    assert out.splitlines()[-2:] == [f"deleted {name} (sharded: 3 shards)", "1 limiter deleted"]
    code, _, err = aiolimit(capsys, url, "inspect", name, "--cluster")
    assert code == 2 and "no limiter" in err
