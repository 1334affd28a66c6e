"""Quick start: guard calls to a downstream service with ``async with limiter:``.

The partner API below (simulated) accepts 5 calls per second and answers 429 beyond that.
Twelve requests start at once; the limiter, set to the partner's rate, spaces them out so
that every one of them succeeds.

    python examples/quickstart.py                                  # in-memory backend
    python examples/quickstart.py --redis redis://localhost:6379   # shared through Redis
    AIOLIMIT_REDIS_URL=redis://localhost:6379 python examples/quickstart.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections import deque
from datetime import timedelta

from redis.asyncio import Redis

from aiolimit import Backend, MemoryBackend, RateLimiter, RateLimiterConfig, RateType, RedisBackend

RATE = 5
INTERVAL = timedelta(seconds=1)


class PartnerAPI:
    """A stand-in for a service that rejects callers going over its rate limit."""

    # The partner's clock is not ours: it forgives a call a few milliseconds early.
    GRACE = 0.02

    def __init__(self, rate: int, interval: timedelta) -> None:
        self.rate = rate
        self.window = interval.total_seconds() - self.GRACE
        self.calls: deque[float] = deque()

    async def get(self, item: int) -> int:
        now = time.monotonic()
        while self.calls and self.calls[0] <= now - self.window:
            self.calls.popleft()
        if len(self.calls) >= self.rate:
            return 429  # Too Many Requests
        self.calls.append(now)
        await asyncio.sleep(0.05)  # the network and the partner's work
        return 200


async def main(redis_url: str | None) -> int:
    redis = Redis.from_url(redis_url) if redis_url else None
    backend: Backend = RedisBackend(redis) if redis else MemoryBackend()
    # The rate goes with the limiter: its first permit makes it the stored rate, in Redis
    # for every process (edit RATE and run again: the new rate holds).
    config = RateLimiterConfig.build(RateType.OVERALL, RATE, INTERVAL)  # or "5/second"
    limiter = RateLimiter("partner-api", backend, rate=config)

    partner = PartnerAPI(RATE, INTERVAL)
    start = time.monotonic()

    async def fetch(item: int) -> int:
        async with limiter:  # waits for a permit, then runs the block
            status = await partner.get(item)
        print(f"{time.monotonic() - start:5.2f}s  item {item:2d} -> {status}", flush=True)
        return status

    try:
        statuses = await asyncio.gather(*(fetch(item) for item in range(1, 13)))
    finally:
        await limiter.delete()  # only so that the next run of this example starts afresh
        if redis is not None:
            await redis.aclose()

    rejected = statuses.count(429)
    print(
        f"{len(statuses)} calls in {time.monotonic() - start:.1f}s, {rejected} rejected by the "
        f"partner (its limit: {RATE} per {INTERVAL.total_seconds():g}s)"
    )
    return 1 if rejected else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--redis",
        metavar="URL",
        default=os.environ.get("AIOLIMIT_REDIS_URL"),
        help="Redis server to share the limiter through (default: $AIOLIMIT_REDIS_URL, "
        "else the in-memory backend)",
    )
    raise SystemExit(asyncio.run(main(parser.parse_args().redis)))
