"""Deployments beyond one plain server: Sentinel failover, TLS and valkey-py clients (the
least-privilege ACL user: test_acl.py). Servers run on loopback, started here."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import valkey.asyncio
import valkey.exceptions
from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel
from servers import Server

from aiolimit import BackendError, RateLimiter, RateLimiterConfig, RateType, RedisBackend
from tools import LocalRedis, free_port
from tools.cluster import wait_until

# -- Sentinel ---------------------------------------------------------------------------------


def sentinel_master_port(sentinel: LocalRedis) -> int:
    """The port of the master the Sentinel names for ``mymaster``."""
    import redis

    with redis.Redis(port=sentinel.port, socket_timeout=2, decode_responses=True) as client:
        address = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster")
    return int(address[1])


@pytest.fixture
def sentinel_setup() -> Iterator[tuple[LocalRedis, LocalRedis, LocalRedis]]:
    # the replica's first sync starts at once instead of after the default 5 s delay
    with (
        LocalRedis("--repl-diskless-sync-delay", "0") as master,
        LocalRedis("--replicaof", "127.0.0.1", str(master.port)) as replica,
        Server.sentinel(master.port) as sentinel,
    ):
        wait_until(lambda: replica_linked(replica), 10, "the replica to sync")
        wait_until(lambda: sentinel_master_port(sentinel) == master.port, 10, "the sentinel")
        wait_until(lambda: sentinel_sees_a_replica(sentinel), 15, "the sentinel's replica")
        yield master, replica, sentinel


def sentinel_sees_a_replica(sentinel: LocalRedis) -> bool:
    """Whether the Sentinel knows a replica of ``mymaster`` it could promote (a failover asked
    before answers NOGOODSLAVE)."""
    import redis

    with redis.Redis(port=sentinel.port, socket_timeout=2, decode_responses=True) as client:
        replicas = client.sentinel_slaves("mymaster")
    return any(r.get("master-link-status") == "ok" and not r.get("is_sdown") for r in replicas)


def replica_linked(replica: LocalRedis) -> bool:
    import redis

    with redis.Redis(port=replica.port, socket_timeout=2, decode_responses=True) as client:
        return bool(client.info("replication").get("master_link_status") == "up")


@pytest.mark.slow
async def test_limiter_keeps_its_state_and_works_after_a_sentinel_failover(
    sentinel_setup: tuple[LocalRedis, LocalRedis, LocalRedis],
) -> None:
    _, replica, sentinel_server = sentinel_setup
    sentinel = Sentinel([("127.0.0.1", sentinel_server.port)], socket_timeout=1)
    client = sentinel.master_for("mymaster", socket_timeout=1)
    try:
        limiter = RateLimiter("sentinel {api}", RedisBackend(client))
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 60))
        assert [await limiter.try_acquire() for _ in range(3)] == [True] * 3
        assert await client.execute_command("WAIT", 1, 5000) == 1  # the grants replicated

        await sentinel.execute_command("SENTINEL", "FAILOVER", "mymaster", once=True)
        await asyncio.to_thread(
            wait_until,
            lambda: sentinel_master_port(sentinel_server) == replica.port,
            15,
            "failover",
        )
        # The client finds the new master by itself; meanwhile only BackendError is raised.
        deadline = time.monotonic() + 10
        for _ in range(200):
            try:
                left = await limiter.available_permits()
                break
            except BackendError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        assert left == 2  # the replica had the grants
        granted = []
        for _ in range(200):
            try:
                granted.append(await limiter.try_acquire())
            except BackendError:  # the old master, now read-only, until the client moves
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            if len(granted) == 3:
                break
        assert granted == [True, True, False]
    finally:
        await client.aclose()


# -- TLS --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server() -> Iterator[tuple[int, str]]:
    """A redis-server that only speaks TLS, with a self-signed certificate for 127.0.0.1."""
    directory = Path(tempfile.mkdtemp(prefix="aiolimit-tls-"))
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert),
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )  # fmt: skip
    try:
        with Server(tls=(str(cert), str(key))) as server:
            yield server.port, str(cert)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def test_limiter_works_over_tls_with_a_self_signed_certificate(
    tls_server: tuple[int, str],
) -> None:
    port, ca = tls_server
    client = Redis.from_url(f"rediss://127.0.0.1:{port}", ssl_ca_certs=ca)
    try:
        limiter = RateLimiter("tls", RedisBackend(client))
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, 60))
        assert await asyncio.gather(*(limiter.try_acquire() for _ in range(3))) == [
            True,
            True,
            False,
        ]
    finally:
        await client.aclose()


@pytest.mark.slow
async def test_tls_server_refuses_a_client_that_does_not_trust_its_certificate(
    tls_server: tuple[int, str],
) -> None:
    port, _ = tls_server
    client = Redis.from_url(f"rediss://127.0.0.1:{port}", socket_connect_timeout=2)
    try:
        with pytest.raises(BackendError, match=r"unreachable|certificate"):
            await RateLimiter("tls", RedisBackend(client)).try_acquire()
    finally:
        await client.aclose()


# -- valkey-py clients ------------------------------------------------------------------------


@pytest.fixture
async def valkey_client(redis_server: LocalRedis) -> Iterator[valkey.asyncio.Valkey]:
    client = valkey.asyncio.Valkey(port=redis_server.port)
    await client.flushall()
    try:
        yield client  # type: ignore[misc]
    finally:
        await client.aclose()


async def test_a_valkey_py_client_grants_refuses_and_waits(
    valkey_client: valkey.asyncio.Valkey, monkeypatch: pytest.MonkeyPatch
) -> None:
    limiter = RateLimiter("valkey-py", RedisBackend(valkey_client))
    await valkey_client.script_flush()  # as on a fresh server
    await valkey_client.function_flush()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the client's own command path was used")

    # Its round trips are packed once and written to a pooled connection, as redis-py's are.
    monkeypatch.setattr(valkey.asyncio.Valkey, "execute_command", refuse)
    monkeypatch.setattr(valkey.asyncio.Valkey, "pipeline", refuse)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, 0.3))
    assert await asyncio.gather(*(limiter.try_acquire() for _ in range(3))) == [
        True,
        True,
        False,
    ]
    assert await limiter.try_acquire(timeout=1)  # sleeps until the first two leave the window
    await limiter.release(1)  # hands back the grant just made
    assert await limiter.available_permits() == 2
    assert await limiter.get_config() is not None
    assert await limiter.delete()


async def exercise(limiter: RateLimiter) -> None:
    """Runs every operation once."""
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, 60))
    assert await limiter.try_acquire(2)
    await limiter.release(1)
    assert await limiter.available_permits() == 1
    assert await limiter.expire(60)
    assert await limiter.delete()


async def test_a_valkey_py_client_works_once_the_scripts_are_cached(
    valkey_client: valkey.asyncio.Valkey, redis_server: LocalRedis
) -> None:
    loader = Redis.from_url(redis_server.url)  # redis-py falls back to EVAL, caching them
    try:
        await valkey_client.script_flush()
        await exercise(RateLimiter("loader", RedisBackend(loader)))
    finally:
        await loader.aclose()
    await exercise(RateLimiter("valkey-py", RedisBackend(valkey_client)))


@pytest.mark.slow
async def test_a_valkey_py_client_reports_an_unreachable_server_as_backend_error() -> None:
    client = valkey.asyncio.Valkey(port=free_port(), socket_connect_timeout=1)
    try:
        with pytest.raises(BackendError):
            await RateLimiter("valkey-py", RedisBackend(client)).try_acquire()
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()
