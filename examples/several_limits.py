"""Several limits at once: 3 calls per second AND 20 per minute to one partner API.

The partner answers 429 when either limit is broken. One limiter applies both rates in one
atomic step: a call goes out only when both allow it, and a caller that must wait is given the
exact instant both do. A refused or waiting call consumes nothing in either rate.

The example runs on a compressed clock (``--time-scale 20``: a "second" lasts 50 ms and a
"minute" 3 s), so its 24 calls take about 3 s instead of a minute.

    python examples/several_limits.py                                  # in-memory backend
    python examples/several_limits.py --redis redis://localhost:6379   # shared through Redis
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections import deque

from redis.asyncio import Redis

from aiolimit import Backend, MemoryBackend, Rate, RateLimiter, RateType, RedisBackend

RATES = Rate.parse("3/second; 20/minute")
CALLS = 24


class Lateness:
    """How late this process runs, as a ticker due every 5 ms sees it. On a busy machine the
    process may not run for a while: calls the limiter spaced out then reach the partner
    together at its end, and the partner below (simulated in this same process) allows for
    that, as a partner elsewhere, which saw the calls leave as spaced, would not need to."""

    PERIOD = 0.005

    def __init__(self) -> None:
        self.due = time.monotonic()
        self.ticks: deque[tuple[float, float]] = deque(maxlen=20)  # (woke, how late): 0.1 s
        self.most = 0.0

    async def tick(self) -> None:
        while True:
            self.due = time.monotonic() + self.PERIOD
            await asyncio.sleep(self.PERIOD)
            woke = time.monotonic()
            self.ticks.append((woke, woke - self.due))
            self.most = max(self.most, woke - self.due)

    def now(self) -> float:
        """How late the process ran in the last 0.1 s: the tick due now, or one before."""
        at = time.monotonic()
        recent = (late for woke, late in self.ticks if woke > at - 0.1)
        return max(at - self.due, *recent, 0.0)


class PartnerApi:
    """The partner's side: answers 429 when a call breaks any of its limits (sliding
    windows over the calls it accepted)."""

    def __init__(self, rates: tuple[Rate, ...], lateness: Lateness) -> None:
        self.rates = rates
        self.lateness = lateness
        self.accepted: list[float] = []  # when each call was due: less how late we ran then
        self.rejected = 0

    async def call(self, i: int) -> int:
        at = time.monotonic()
        for rate in self.rates:
            window = rate.interval.total_seconds()
            # 10 ms of slack, as a partner allows for network jitter: a call reaches it a little
            # after the limiter granted it, and calls granted together arrive spread out.
            recent = [t for t in self.accepted if t > at - window + 0.010]
            if len(recent) >= rate.permits:
                self.rejected += 1
                return 429
        self.accepted.append(at - self.lateness.now())
        return 200


async def run(backend: Backend, scale: float) -> None:
    rates = [Rate(rate.permits, rate.interval / scale) for rate in RATES]
    lateness = Lateness()
    ticker = asyncio.create_task(lateness.tick())
    partner = PartnerApi(tuple(rates), lateness)
    limiter = RateLimiter("example-several-limits", backend)
    await limiter.set_rate(RateType.OVERALL, rates)  # both must hold
    start = time.monotonic()
    waited: list[int] = []

    async def call(i: int) -> None:
        before = time.monotonic()
        async with limiter:  # waits for the instant both rates allow this call
            status = await partner.call(i)
        if time.monotonic() - before > 30 / scale:  # waited for the minute window
            waited.append(i)
        print(f"call {i:2d} at {(time.monotonic() - start) * scale:5.1f} s (scaled): {status}")

    for i in range(CALLS):  # one caller after another, as a worker loop would
        await call(i)
    ticker.cancel()
    await limiter.delete()
    print(
        f"{CALLS} calls, {partner.rejected} rejected with 429; the per-minute limit held back "
        f"call {', '.join(map(str, waited)) or 'none'} (the per-second one paced the others)"
    )
    print(f"this process ran up to {lateness.most * 1000:.0f} ms late (a busy machine)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis", default=os.environ.get("AIOLIMIT_REDIS_URL") or None)
    parser.add_argument("--time-scale", type=float, default=20.0, help="clock speed-up (20)")
    args = parser.parse_args()
    if args.redis:
        redis = Redis.from_url(args.redis)
        backend = RedisBackend(redis)
        try:
            await run(backend, args.time_scale)
        finally:
            await backend.aclose()
            await redis.aclose()
    else:
        await run(MemoryBackend(), args.time_scale)


if __name__ == "__main__":
    asyncio.run(main())
