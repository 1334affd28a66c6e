"""Round trips on a plain client's pooled connection (``_wire``: one ``send_packed_command``,
the replies read with ``read_response``) against a real server, for redis-py and valkey-py
clients as they come, in RESP2 and RESP3: every reply read in order, error replies, RESP3
push messages arriving in the middle of a round trip, and killed connections included."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from redis.asyncio import Redis
from valkey.asyncio import Valkey

from aiolimit import RateLimiter, RateLimiterConfig, RateType, RedisBackend
from tools import LocalRedis

PREFIX = "compat:"
CASES = [(library, protocol) for library in ("redis", "valkey") for protocol in (2, 3)]


def case_id(case: tuple[str, int]) -> str:
    return "{}-resp{}".format(*case)


def client(url: str, case: tuple[str, int], **options: Any) -> Any:
    """A client of ``case`` (library, protocol), with its library's defaults otherwise
    (redis-py 8: a 5 s socket timeout, maintenance notifications on in RESP3)."""
    library, protocol = case
    kind = Valkey if library == "valkey" else Redis
    return kind.from_url(url, protocol=protocol, **options)


@pytest.mark.parametrize("case", CASES, ids=case_id)
async def test_round_trips_read_grants_refusals_and_error_replies(
    redis_server: LocalRedis, case: tuple[str, int]
) -> None:
    setup = Redis.from_url(redis_server.url)
    name = "compat-{}-{}".format(*case)
    await RateLimiter(name, RedisBackend(setup, prefix=PREFIX)).set_rate(
        RateLimiterConfig.build(RateType.OVERALL, 60, 60)
    )
    await setup.execute_command("FUNCTION", "FLUSH")  # the first calls get error replies
    await setup.script_flush()
    redis = client(redis_server.url, case)
    try:
        limiter = RateLimiter(name, RedisBackend(redis, prefix=PREFIX))
        # 70 at once: one round trip of two calls (64 requests at most per call).
        taken = await asyncio.gather(*(limiter.try_acquire() for _ in range(70)))
        assert taken == [True] * 60 + [False] * 10
        assert await limiter.available_permits() == 0
        assert await limiter.try_acquire() is False
        await limiter.delete()
    finally:
        await redis.aclose()
        await setup.aclose()


@pytest.mark.parametrize("case", CASES, ids=case_id)
async def test_round_trips_are_sent_again_after_their_connections_are_killed(
    redis_server: LocalRedis, caplog: pytest.LogCaptureFixture, case: tuple[str, int]
) -> None:
    # Every connection of the client killed, five times, while 64 callers keep taking
    # permits: a round trip whose connection was lost fails as the client's ConnectionError
    # and is sent again on a new one (the coalescer's resend), so every caller gets a grant
    # or a refusal, never an error, and no more than the rate's permits are granted.
    caplog.set_level(logging.DEBUG, "aiolimit")
    admin = Redis.from_url(redis_server.url)
    redis = client(redis_server.url, case)
    limiter = RateLimiter("compat-kill-{}-{}".format(*case), RedisBackend(redis, prefix=PREFIX))
    done = False

    async def caller() -> list[bool]:
        taken = []
        while not done:
            taken.append(await limiter.try_acquire())
        return taken

    try:
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1000, 60))
        callers = asyncio.gather(*(caller() for _ in range(64)))
        for _ in range(5):
            await asyncio.sleep(0.02)
            await admin.client_kill_filter(_type="normal", skipme=True)
        done = True
        granted = sum(map(sum, await callers))
        left = await limiter.available_permits()
        assert 0 < granted <= granted + left <= 1000
        assert await limiter.try_acquire() is (left > 0)
        assert any("connection to Redis lost" in r.getMessage() for r in caplog.records)
        await limiter.delete()
    finally:
        await redis.aclose()
        await admin.aclose()


@pytest.mark.parametrize("library", ["redis", "valkey"])
async def test_push_messages_in_the_middle_of_round_trips_leave_every_reply_whole(
    redis_server: LocalRedis, library: str
) -> None:
    # RESP3 client-side caching (broadcast mode) on the connection the round trips use:
    # every write of a round trip sends an invalidation push, which the server writes after
    # the round trip's replies, so the next round trip on the connection reads it before
    # its own replies. read_response reads each push and sets it aside; each reply goes to
    # its own caller: exactly the permits of each rate are granted.
    # (8 callers: one round trip in flight at a time, so one connection, kept for the burst.)
    pushes = 0

    def counted(message: Any) -> None:
        nonlocal pushes
        pushes += 1

    async def track(connection: Any) -> None:
        await connection.on_connect()  # (every connection, as it connects)
        await connection.send_command("CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", PREFIX)
        assert await connection.read_response() in (b"OK", "OK")
        connection._parser.set_invalidation_push_handler(counted)  # (the test's count)

    async def caller(first: int) -> list[bool]:
        return [await limiters[(first + i) % 4].try_acquire() for i in range(50)]

    # (redis_connect_func, valkey_connect_func)
    redis = client(redis_server.url, (library, 3), **{f"{library}_connect_func": track})
    backend = RedisBackend(redis, prefix=PREFIX)
    limiters = [RateLimiter(f"compat-push-{library}-{i}", backend) for i in range(4)]
    try:
        for limiter in limiters:
            await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 80, 60))
        taken = await asyncio.gather(*(caller(first) for first in range(8)))
        assert sum(map(sum, taken)) == 4 * 80
        assert [await limiter.available_permits() for limiter in limiters] == [0] * 4
        assert pushes >= 20
        for limiter in limiters:
            await limiter.delete()
    finally:
        await redis.aclose()
