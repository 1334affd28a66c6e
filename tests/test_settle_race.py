"""Settles racing acquires from 4 processes on one redis-server: in any window of the interval,
the permits the grants hold once settled (and the charges, at their settle's time) never
exceed the rate plus ``max_debt``; every refusal says when to come back."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time

import pytest
from redis.asyncio import Redis

from aiolimit import RateLimiter, RateLimiterConfig, RateType, RedisBackend
from tools import LocalRedis
from tools.audit import busiest_window

pytestmark = pytest.mark.slow

RATE, MAX_DEBT, SECONDS = 100, 20, 2.0
NAME = "settle-race"

Stamp = tuple[float, float, int]


def worker(url: str, seed: int) -> tuple[list[Stamp], int, int]:
    """Reserves and settles for SECONDS: the stamps of what it holds, its refusals, and the
    refusals that did not say when to come back."""
    return asyncio.run(_work(url, seed))


async def _work(url: str, seed: int) -> tuple[list[Stamp], int, int]:
    rng = random.Random(seed)
    redis = Redis.from_url(url)
    limiter = RateLimiter(NAME, RedisBackend(redis, clock=time.time))  # the wall clock: stamps
    stamps: list[Stamp] = []
    refused = unexplained = 0
    end = time.monotonic() + SECONDS
    try:
        while time.monotonic() < end:
            reserved = rng.randint(1, 20)
            acquired = await limiter.reserve(reserved)
            if not acquired:
                refused += 1
                unexplained += not acquired.retry_after > 0
                await asyncio.sleep(rng.uniform(0, 0.01))
                continue
            start = acquired.attempts[0].starts_at / 1e6  # type: ignore[union-attr]
            before = time.time()
            settled = await acquired.settle(rng.randint(0, 40))
            after = time.time()
            stamps.append((start, start, reserved - settled.handed_back))
            if settled.charged:
                stamps.append((before, after, settled.charged))
    finally:
        await redis.aclose()
    return stamps, refused, unexplained


async def test_settles_racing_acquires_from_four_processes_keep_rate_plus_max_debt(
    redis_server: LocalRedis,
) -> None:
    url = f"{redis_server.url}/7"
    redis = Redis.from_url(url)
    await redis.flushdb()
    setup = RateLimiter(NAME, RedisBackend(redis))
    await setup.set_rate(RateLimiterConfig.build(RateType.OVERALL, RATE, 1, max_debt=MAX_DEBT))
    try:
        with multiprocessing.get_context("spawn").Pool(4) as pool:
            results = await asyncio.to_thread(
                pool.starmap, worker, [(url, seed) for seed in range(4)]
            )
    finally:
        await setup.delete()
        await redis.aclose()
    stamps = [stamp for result in results for stamp in result[0]]
    refused = sum(result[1] for result in results)
    assert len(stamps) > 10 and refused > 0  # a real race: grants, charges and refusals
    assert sum(result[2] for result in results) == 0  # every refusal said when
    window = busiest_window(stamps, 1.0, rate=RATE + MAX_DEBT, slack=0.005)
    assert window.over == 0, window
