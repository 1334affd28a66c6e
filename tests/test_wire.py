"""Round trips on a plain redis-py client are packed by aiolimit and written to a pooled
connection; any other client gets them through its own execute_command and pipeline."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from aiolimit import RateLimiter, RateType, RedisBackend
from aiolimit._tools import LocalRedis


def refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("redis-py's own command path was used")


async def test_a_plain_clients_round_trips_skip_redis_pys_command_path(
    redis_server: LocalRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    redis = Redis.from_url(redis_server.url)
    try:
        limiter = RateLimiter("wire", RedisBackend(redis, prefix="wire:"))
        await limiter.set_rate(RateType.OVERALL, 60, 60)
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
        await limiter.set_rate(RateType.OVERALL, 60, 60)
        taken = await asyncio.gather(*(limiter.try_acquire() for _ in range(70)))
        assert taken == [True] * 60 + [False] * 10
        assert Subclass.pipelines > 0
        await limiter.delete()
    finally:
        await redis.aclose()
