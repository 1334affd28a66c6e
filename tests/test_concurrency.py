"""Several independent clients hammer one OVERALL limiter on a real redis-server.

Each client has its own connection and client id, as separate processes would. Every grant
is recorded with the time the script stamped on it (the server's clock), and the audit
checks, from those times alone, that no sliding window ever held more than the rate and
that the clients together used nearly all of it.
"""

from __future__ import annotations

import asyncio
import os
import random

import pytest
from recording import GrantRecord, RecordingBackend
from redis.asyncio import Redis

from aiolimit import RateLimiter, RateLimiterConfig, RateType
from tools import LocalRedis, busiest_window

RATE = 50
INTERVAL_US = 500_000
RUN_SECONDS = 3.0
CLIENTS = 6
TASKS_PER_CLIENT = 10


async def worker(limiter: RateLimiter, style: int, seed: int, deadline: float) -> None:
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    while loop.time() < deadline:
        permits = rng.choice([1, 1, 1, 1, 2, 3, 5])
        if style == 0:
            await limiter.acquire(permits)
        elif style == 1:
            await limiter.try_acquire(permits, timeout=rng.uniform(0.05, 0.6))
        elif style == 2:
            async with limiter:
                pass
        else:  # one attempt straight at the backend, as a polling client would
            if not (await limiter.backend.try_acquire(limiter.name, permits)).granted:
                await asyncio.sleep(rng.uniform(0.005, 0.02))


@pytest.mark.slow
async def test_independent_clients_never_exceed_the_rate_and_use_nearly_all_of_it(
    redis_server: LocalRedis,
) -> None:
    name = f"hammered-{os.getpid()}"
    grants: list[GrantRecord] = []
    connections = [Redis.from_url(redis_server.url) for _ in range(CLIENTS)]
    backends = [
        RecordingBackend(redis, grants, client_id=f"client-{i}")
        for i, redis in enumerate(connections)
    ]
    try:
        await RateLimiter(name, backends[0]).set_rate(
            RateLimiterConfig.build(RateType.OVERALL, RATE, INTERVAL_US / 1e6)
        )
        deadline = asyncio.get_running_loop().time() + RUN_SECONDS
        await asyncio.wait_for(
            asyncio.gather(
                *(
                    worker(RateLimiter(name, backend), task % 4, client * 100 + task, deadline)
                    for client, backend in enumerate(backends)
                    for task in range(TASKS_PER_CLIENT)
                )
            ),
            RUN_SECONDS + 10,
        )
    finally:
        for redis in connections:
            await redis.aclose()

    granted = [g for g in grants if not g.handed_back]
    assert len({g.member for g in granted}) == len(granted), "a grant was logged twice"
    most = busiest_window([g.stamp for g in granted], INTERVAL_US).most
    assert most <= RATE, f"{most} permits in one window of {INTERVAL_US} us, rate {RATE}"

    # Utilisation over whole windows from the first grant, while every client still asked.
    start = min(g.time for g in granted)
    windows = int(RUN_SECONDS * 1_000_000 // INTERVAL_US)
    used = sum(g.permits for g in granted if g.time < start + windows * INTERVAL_US)
    allowed = RATE * windows
    assert used <= allowed
    assert used >= 0.9 * allowed, f"only {used} of {allowed} permits used"
