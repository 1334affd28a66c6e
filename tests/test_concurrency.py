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
from dataclasses import dataclass

import pytest
from redis.asyncio import Redis
from servers import Server

from aiolimit import RateLimiter, RateType, RedisBackend
from aiolimit.backends import Attempt

RATE = 50
INTERVAL_US = 500_000
RUN_SECONDS = 3.0
CLIENTS = 6
TASKS_PER_CLIENT = 10


@dataclass
class Grant:
    member: str | None
    time: int
    permits: int
    handed_back: bool = False


class RecordingBackend(RedisBackend):
    """A RedisBackend that notes every grant it receives and every exact grant handed back."""

    def __init__(self, redis: Redis, grants: list[Grant], client_id: str) -> None:
        super().__init__(redis, client_id=client_id)
        self.grants = grants

    async def try_acquire(self, name: str, permits: int, max_wait: int = 0) -> Attempt:
        attempt = await super().try_acquire(name, permits, max_wait)
        if attempt.granted:
            self.grants.append(Grant(attempt.grant, attempt.time, permits))
        return attempt

    async def release(self, name: str, permits: int, grant: str | None = None) -> int:
        released = await super().release(name, permits, grant)
        if released and grant is not None:
            for noted in reversed(self.grants):
                if noted.member == grant and not noted.handed_back:
                    noted.handed_back = True
                    break
        return released


def most_in_one_window(grants: list[Grant]) -> int:
    """The most permits granted in any window (t - interval, t]."""
    times = sorted((g.time, g.permits) for g in grants if not g.handed_back)
    most = held = first = 0
    for time, permits in times:
        held += permits
        while times[first][0] <= time - INTERVAL_US:
            held -= times[first][1]
            first += 1
        most = max(most, held)
    return most


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
    redis_server: Server,
) -> None:
    name = f"hammered-{os.getpid()}"
    grants: list[Grant] = []
    connections = [Redis.from_url(redis_server.url) for _ in range(CLIENTS)]
    backends = [
        RecordingBackend(redis, grants, client_id=f"client-{i}")
        for i, redis in enumerate(connections)
    ]
    try:
        await RateLimiter(name, backends[0]).set_rate(RateType.OVERALL, RATE, INTERVAL_US / 1e6)
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
    most = most_in_one_window(granted)
    assert most <= RATE, f"{most} permits in one window of {INTERVAL_US} us, rate {RATE}"

    # Utilisation over whole windows from the first grant, while every client still asked.
    start = min(g.time for g in granted)
    windows = int(RUN_SECONDS * 1_000_000 // INTERVAL_US)
    used = sum(g.permits for g in granted if g.time < start + windows * INTERVAL_US)
    allowed = RATE * windows
    assert used <= allowed
    assert used >= 0.9 * allowed, f"only {used} of {allowed} permits used"
