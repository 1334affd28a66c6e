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
from datetime import timedelta

from redis.asyncio import Redis

from aiolimit import (
    Backend,
    MemoryBackend,
    Rate,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
    acquire_all,
)

RATES = Rate.parse("3/second; 20/minute")
CALLS = 24


class PartnerApi:
    """The partner's side: answers 429 when a call breaks any of its limits (sliding
    windows over the calls it accepted).

    It judges each call by when the limiter let it go: the start of its grant, on the
    limiter's clock. A partner elsewhere sees a call when it arrives instead, a little after
    its grant started; this one runs in the same process as the callers, and on a busy machine
    the process (or Redis) may not run for a while, so calls the limiter spaced out would reach
    it together and be judged for the machine's load, not for the limiter's spacing."""

    def __init__(self, rates: tuple[Rate, ...]) -> None:
        self.rates = rates
        self.accepted: list[int] = []  # the grants' starts, in microseconds (exact)
        self.rejected = 0

    async def call(self, i: int, sent: int) -> int:
        for rate in self.rates:
            window = rate.interval // timedelta(microseconds=1)
            recent = [t for t in self.accepted if t > sent - window]
            if len(recent) >= rate.permits:
                self.rejected += 1
                return 429
        self.accepted.append(sent)
        return 200


async def run(backend: Backend, scale: float) -> None:
    rates = [Rate(rate.permits, rate.interval / scale) for rate in RATES]
    partner = PartnerApi(tuple(rates))
    limiter = RateLimiter("example-several-limits", backend)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, rates))  # both must hold
    first: int | None = None
    waited: list[int] = []

    async def call(i: int) -> None:
        nonlocal first
        # Waits for the instant both rates allow this call, as `async with limiter:` does,
        # and says which instant that was: the grant's start, on the limiter's clock.
        loop = asyncio.get_running_loop()
        asked = loop.time()
        acquired = await acquire_all([(limiter, 1)], timeout=None)  # None: always granted
        wait = loop.time() - asked  # (it may have asked more than once meanwhile)
        sent = acquired.attempts[0].starts_at  # microseconds
        first = sent if first is None else first
        status = await partner.call(i, sent)
        if wait > 30 / scale:  # waited for the minute window
            waited.append(i)
        print(
            f"call {i:2d} at {(sent - first) / 1e6 * scale:6.2f} s (scaled), "
            f"waited {wait * scale:5.2f} s: {status}"
        )

    for i in range(CALLS):  # one caller after another, as a worker loop would
        await call(i)
    await limiter.delete()
    print(
        f"{CALLS} calls, {partner.rejected} rejected with 429; the per-minute limit held back "
        f"call {', '.join(map(str, waited)) or 'none'} (the per-second one paced the others)"
    )


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
