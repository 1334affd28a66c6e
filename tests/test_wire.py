"""Round trips on a plain redis-py client are packed by aiolimit and written to a pooled
connection; any other client gets them through its own execute_command and pipeline."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.connection import BlockingConnectionPool, Connection, ConnectionPool

import aiolimit
from aiolimit import RateLimiter, RateLimiterConfig, RateType, RedisBackend
from aiolimit.backends.redis import _wire
from tools import LocalRedis


def refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("redis-py's own command path was used")


@pytest.mark.parametrize("protocol", [2, 3])
async def test_a_plain_clients_round_trips_skip_redis_pys_command_path(
    redis_server: LocalRedis, monkeypatch: pytest.MonkeyPatch, protocol: int
) -> None:
    # Not the client's command path (its pipeline encodes every argument again and keeps a
    # command stack): a round trip is packed once and written to a pooled connection
    # (tests/test_wire_compat.py: against both libraries, pushes and killed connections).
    # Error replies (here NOSCRIPT, then the source) still read right, in RESP2 and RESP3.
    redis = Redis.from_url(redis_server.url, protocol=protocol)
    try:
        limiter = RateLimiter("wire", RedisBackend(redis, prefix="wire:"))
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 60, 60))
        await redis.execute_command("FUNCTION", "FLUSH")
        await redis.script_flush()
        monkeypatch.setattr(Redis, "execute_command", refuse)
        monkeypatch.setattr(Redis, "pipeline", refuse)
        # 70 at once: one round trip of two calls (64 requests at most per call).
        taken = await asyncio.gather(*(limiter.try_acquire() for _ in range(70)))
        assert taken == [True] * 60 + [False] * 10
        assert await limiter.available_permits() == 0
        monkeypatch.undo()
        await limiter.delete()
    finally:
        await redis.aclose()


class Subclass(Redis):
    """A client aiolimit does not know the insides of: its own command path is used."""

    pipelines = 0

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        Subclass.pipelines += 1
        return super().pipeline(*args, **kwargs)


async def test_any_other_client_gets_round_trips_through_its_own_pipeline(
    redis_server: LocalRedis,
) -> None:
    redis = Subclass.from_url(redis_server.url)
    try:
        limiter = RateLimiter("wire-sub", RedisBackend(redis, prefix="wire:"))
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 60, 60))
        taken = await asyncio.gather(*(limiter.try_acquire() for _ in range(70)))
        assert taken == [True] * 60 + [False] * 10
        assert Subclass.pipelines > 0
        await limiter.delete()
    finally:
        await redis.aclose()


async def test_a_client_with_health_checks_gets_them_on_its_round_trips(
    redis_server: LocalRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The interval is made short once the connection is made: a check due in the middle of
    # redis-py's own connection handshake (a busy machine) reads the handshake's replies.
    redis = Redis.from_url(redis_server.url, health_check_interval=30)
    checks = 0
    check_health = Connection.check_health

    async def counted(self: Connection) -> None:
        nonlocal checks
        checks += 1
        await check_health(self)

    try:
        limiter = RateLimiter("wire-health", RedisBackend(redis, prefix="wire:"))
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 60, 60))
        (connection,) = redis.connection_pool._available_connections
        connection.health_check_interval = 0.001
        monkeypatch.setattr(Connection, "check_health", counted)
        for _ in range(3):
            await asyncio.sleep(0.002)  # each round trip's connection is due a check
            assert await limiter.try_acquire()
        assert checks >= 3
        monkeypatch.undo()
        await limiter.delete()
    finally:
        await redis.aclose()


# A script that keeps the server busy for ARGV[1] µs.
BUSY = """
local t = redis.call('TIME')
repeat
    local n = redis.call('TIME')
until (n[1] - t[1]) * 1000000 + (n[2] - t[2]) >= tonumber(ARGV[1])
"""


@pytest.mark.slow
async def test_a_round_trip_past_the_socket_timeout_drops_its_connection(
    redis_server: LocalRedis,
) -> None:
    # The whole round trip is bounded by the connection's socket timeout: a script that runs
    # longer (a stalled server) fails as the client's own TimeoutError, and the connection it
    # was read on is closed, never handed out again half-read.
    redis = Redis.from_url(redis_server.url, socket_timeout=0.2)
    staller = Redis.from_url(redis_server.url)
    try:
        backend = RedisBackend(
            redis, prefix="wire:", timeout=None, breaker=aiolimit.BreakerPolicy(first_backoff=0)
        )
        limiter = RateLimiter("wire-stall", backend)
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 60, 60))
        (connection,) = redis.connection_pool._available_connections
        stall = asyncio.ensure_future(staller.eval(BUSY, 0, 600_000))
        await asyncio.sleep(0.05)
        with pytest.raises(aiolimit.BackendError) as raised:
            await limiter.try_acquire()
        assert isinstance(raised.value.__cause__, redis_errors.TimeoutError)
        assert not connection.is_connected
        await stall
        assert await limiter.try_acquire()
        await limiter.delete()
    finally:
        await redis.aclose()
        await staller.aclose()


async def test_round_trips_in_a_burst_share_a_connection_and_give_it_back(
    redis_server: LocalRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Taking a connection from redis-py's pool and giving it back costs more than a small
    # round trip: while round trips keep coming, the one kept serves the next; once none is
    # under way or waiting, every connection is back in the pool.
    redis = Redis.from_url(redis_server.url)
    taken = round_trips = 0
    get_connection = ConnectionPool.get_connection
    exchange = _wire._Connections.exchange

    async def counted_get(self: ConnectionPool, *args: Any, **kwargs: Any) -> Any:
        nonlocal taken
        taken += 1
        return await get_connection(self, *args, **kwargs)

    async def counted_exchange(*args: Any) -> Any:
        nonlocal round_trips
        round_trips += 1
        return await exchange(*args)

    async def caller() -> None:
        for _ in range(20):
            assert await limiter.try_acquire()

    try:
        limiter = RateLimiter("wire-burst", RedisBackend(redis, prefix="wire:"))
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 10_000, 60))
        monkeypatch.setattr(ConnectionPool, "get_connection", counted_get)
        monkeypatch.setattr(_wire._Connections, "exchange", counted_exchange)
        await asyncio.gather(*(caller() for _ in range(64)))
        assert round_trips >= 20
        assert 1 <= taken <= 2  # (two round trips in flight at most)
        pool = redis.connection_pool
        assert not pool._in_use_connections
        assert len(pool._available_connections) == taken
        monkeypatch.undo()
        await limiter.delete()
    finally:
        await redis.aclose()


async def test_a_blocking_pools_connection_goes_back_after_each_round_trip(
    redis_server: LocalRedis,
) -> None:
    # Callers of a BlockingConnectionPool wait for a free connection: none is kept from it,
    # so with one connection the client's own commands still get it between round trips of
    # a burst that lasts longer than the pool lets them wait.
    pool = BlockingConnectionPool.from_url(redis_server.url, max_connections=1, timeout=1)
    redis = Redis(connection_pool=pool)
    loop = asyncio.get_running_loop()
    done = False

    async def caller() -> None:
        end = loop.time() + 3
        while not done and loop.time() < end:
            assert await limiter.try_acquire()

    async def own_commands() -> int:
        nonlocal done
        await asyncio.sleep(0.1)  # in the middle of the burst
        try:
            return sum([await redis.ping() for _ in range(20)])
        finally:
            done = True

    try:
        limiter = RateLimiter("wire-blocking", RedisBackend(redis, prefix="wire:"))
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 10**9, 60))
        *_, answered = await asyncio.gather(*(caller() for _ in range(16)), own_commands())
        assert answered == 20
        await limiter.delete()
    finally:
        await redis.aclose()


@pytest.mark.slow
def test_commands_are_packed_as_redis_py_packs_them() -> None:
    commands = [
        ("FCALL", "aiolimit_acquire_many", 2, b"{a}:config", b"", b"x" * 255, b"y" * 256),
        ("FCALL", "f", 1, b"k" * 511, b"a", b"w" * 512),  # (a long one after bytes packed by C)
        ("FCALL", "f", 1, b"k", b"1 - 0 1", "xé", 7),  # (a str, an int after bytes)
        ("SET", "k\u00e9y", b"v" * 1000, "PX", 1500),
        ("PING",),
    ]
    assert _wire._packed(commands) == b"".join(Connection().pack_commands(commands))
