"""Redis memory one limiter takes, per algorithm, after many grants.

    python benchmarks/memory_per_limiter.py                  # 100 000 grants at 100 000 per hour
    python benchmarks/memory_per_limiter.py --grants 10000   # quicker

Starts its own redis-server on a free 127.0.0.1 port (stopped at the end), grants ``--grants``
permits one by one (64 tasks, coalesced) on a limiter of ``--grants`` per hour with each
algorithm, with one rate and with two ("N/hour; N/10 seconds"), and prints the sum of
``MEMORY USAGE`` over every key of the limiter (its hash tag), and the keys it holds.
Target: at most 200 bytes per limiter for the token bucket and the fixed windows.
"""

from __future__ import annotations

import argparse
import asyncio
import platform

from redis.asyncio import Redis

from aiolimit import Algorithm, Rate, RateLimiter, RateType, RedisBackend
from tools import LocalRedis

TASKS = 64


async def fill(limiter: RateLimiter, grants: int) -> None:
    per_task, extra = divmod(grants, TASKS)

    async def task(count: int) -> None:
        for _ in range(count):
            if not await limiter.try_acquire():
                raise SystemExit(f"{limiter.name}: refused before {grants} grants")

    await asyncio.gather(*(task(per_task + (i < extra)) for i in range(TASKS)))


async def usage(redis: Redis, name: str) -> tuple[int, int]:
    keys = [key async for key in redis.scan_iter(match=f"*{{{name}}}*", count=1000)]
    total = 0
    for key in keys:
        total += await redis.memory_usage(key, samples=0) or 0
    return total, len(keys)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grants", type=int, default=100_000, help="grants per limiter (100000)")
    args = parser.parse_args()
    grants = args.grants
    with LocalRedis() as server:
        redis = Redis.from_url(server.url)
        backend = RedisBackend(redis)
        version = (await redis.info("server"))["redis_version"]
        print(
            f"redis-server {version} on 127.0.0.1, Python {platform.python_version()}; "
            f"{grants} grants per limiter, rate {grants} per hour\n"
        )
        print("| algorithm | rates | bytes (MEMORY USAGE, all keys) | keys | bytes per grant |")
        print("|---|---|--:|--:|--:|")
        two = [Rate(grants, 3600), Rate(grants, 10)]  # the second never refuses here
        for algorithm in Algorithm:
            for rates in ([Rate(grants, 3600)], two):
                name = f"mem-{algorithm.value}-{len(rates)}"
                limiter = RateLimiter(name, backend)
                await limiter.set_rate(RateType.OVERALL, rates, algorithm=algorithm)
                await fill(limiter, grants)
                total, keys = await usage(redis, name)
                text = "; ".join(str(rate) for rate in rates)
                print(f"| {algorithm.value} | {text} | {total:,} | {keys} | {total / grants:.2f} |")
                await limiter.delete()
        await backend.aclose()
        await redis.aclose()


if __name__ == "__main__":
    asyncio.run(main())
