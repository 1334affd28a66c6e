"""Memory: the Redis bytes one limiter holds, per algorithm, and what a MemoryBackend grant
costs as a big window fills.

    python benchmarks/memory.py                               # ~15 s
    python benchmarks/memory.py --grants 100000 --at 1000 --at 100000 --at 1000000

``redis``: on its own redis-server (a free 127.0.0.1 port), ``--grants`` permits granted one
by one (64 tasks, coalesced) on a limiter of ``--grants`` per hour, with each algorithm, with
one rate and with two ("N/hour; N/10 seconds"); then the sum of ``MEMORY USAGE`` over every
key of the limiter (its hash tag), and the keys it holds.

``fill``: one OVERALL limiter of 1 000 000 per hour on ``MemoryBackend(clock=fake)``, where
the fake clock moves 1 µs at every reading, so no grant leaves the window and two grants never
share a time. One task calls ``try_acquire()`` until the window holds each ``--at`` mark; the
next 1 000 grants are timed one by one (``perf_counter_ns`` around the ``await``): median, p99
and mean in µs. At the mark 1 000 000 the block is the 1 000 grants that fill the window, and
one more block times 1 000 refusals on the full window. The garbage collector runs as usual.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from _harness import Table, local_redis, machine, number, parser, percentile, report

from aiolimit import (
    Algorithm,
    MemoryBackend,
    Rate,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
)

TASKS = 64
RATE = 1_000_000  # fill: permits per hour
BLOCK = 1_000  # fill: grants timed at each mark


# -- Redis bytes per limiter --------------------------------------------------------------------


async def _grant(limiter: RateLimiter, grants: int) -> None:
    per_task, extra = divmod(grants, TASKS)

    async def task(count: int) -> None:
        for _ in range(count):
            if not await limiter.try_acquire():
                raise SystemExit(f"{limiter.name}: refused before {grants} grants")

    await asyncio.gather(*(task(per_task + (i < extra)) for i in range(TASKS)))


async def redis_bytes(url: str, grants: int) -> list[dict[str, Any]]:
    from redis.asyncio import Redis

    redis = Redis.from_url(url)
    backend = RedisBackend(redis)
    rows = []
    for algorithm in Algorithm:
        for rates in ([Rate(grants, 3600)], [Rate(grants, 3600), Rate(grants, 10)]):
            name = f"mem-{algorithm.value}-{len(rates)}"
            limiter = RateLimiter(name, backend)
            await limiter.set_rate(
                RateLimiterConfig.build(RateType.OVERALL, rates, algorithm=algorithm)
            )
            await _grant(limiter, grants)
            keys = [key async for key in redis.scan_iter(match=f"*{{{name}}}*", count=1000)]
            total = sum([await redis.memory_usage(key, samples=0) or 0 for key in keys])
            rates_text = "; ".join(str(rate) for rate in rates)
            rows.append({"algorithm": algorithm.value, "rates": rates_text, "bytes": total,
                         "keys": len(keys), "bytes_per_grant": total / grants})  # fmt: skip
            await limiter.delete()
    await backend.aclose()
    await redis.aclose()
    return rows


# -- MemoryBackend as the window fills ----------------------------------------------------------


class FakeClock:
    """Seconds; every reading is 1 µs after the previous one."""

    def __init__(self, start_us: int = 1_000_000_000) -> None:
        self.us = start_us

    def __call__(self) -> float:
        self.us += 1
        return self.us / 1_000_000


def _stats(samples: list[float]) -> dict[str, float | None]:
    ordered = sorted(samples)
    return {
        "median_us": percentile(ordered, 0.5),
        "p99_us": percentile(ordered, 0.99),
        "mean_us": sum(ordered) / len(ordered),
    }


async def _timed_block(limiter: RateLimiter, granted: bool) -> list[float]:
    """BLOCK calls of try_acquire(), each timed; each must be granted (or refused)."""
    clock = time.perf_counter_ns
    samples = []
    for _ in range(BLOCK):
        before = clock()
        ok = await limiter.try_acquire()
        samples.append((clock() - before) / 1000)
        if ok is not granted:
            raise SystemExit(f"try_acquire() {'refused' if granted else 'granted'}: unexpected")
    return samples


async def fill(marks: list[int]) -> dict[str, dict[str, float | None]]:
    limiter = RateLimiter("memory-fill", MemoryBackend(clock=FakeClock()))
    await limiter.try_set_rate(RateLimiterConfig.build(RateType.OVERALL, RATE, 3600.0))
    results: dict[str, dict[str, float | None]] = {}
    granted = 0
    for start in sorted({min(mark, RATE - BLOCK) for mark in marks}):
        while granted < start:  # fill up to the mark, untimed
            if not await limiter.try_acquire():
                raise SystemExit(f"refused after {granted} grants: the window should hold them")
            granted += 1
        results[f"{start:,}..{start + BLOCK - 1:,}"] = _stats(await _timed_block(limiter, True))
        granted += BLOCK
        print(f"  {granted:,} grants in the window", file=sys.stderr, flush=True)
    if granted == RATE:  # the window is full: what does a refusal cost?
        results[f"{RATE:,} (full: refused)"] = _stats(await _timed_block(limiter, False))
    return results


def main() -> None:
    cli = parser(__doc__)
    cli.add_argument("--grants", type=int, default=10_000, help="redis: grants (10000)")
    cli.add_argument("--at", type=int, action="append", help="fill: grants in the window "
                     "(repeatable; 1000 and 100000)")  # fmt: skip
    cli.add_argument("--only", choices=["redis", "fill"], help="one of the two")
    args = cli.parse_args()
    marks = args.at or [1_000, 100_000]
    if any(not BLOCK <= m <= RATE for m in marks):
        cli.error(f"each --at must be between {BLOCK:,} and {RATE:,}")
    tables, figures = [], {}
    about = machine()
    if args.only != "fill":
        with local_redis() as url:
            figures["redis"] = asyncio.run(redis_bytes(url, args.grants))
            about = machine(url)
        out = Table(["algorithm", "rates", "bytes (MEMORY USAGE, all keys)", "keys",
                     "bytes per grant"], left=2)  # fmt: skip
        for row in figures["redis"]:
            out.add(row["algorithm"], row["rates"], f"{row['bytes']:,}", row["keys"],
                    number(row["bytes_per_grant"], 2))  # fmt: skip
        out.title = f"Redis, {args.grants:,} grants at {args.grants:,} per hour:"
        tables.append(out)
    if args.only != "redis":
        figures["fill"] = asyncio.run(fill(marks))
        out = Table(["grants in the window", "try_acquire µs, median", "p99", "mean"])
        for label, stats in figures["fill"].items():
            out.add(label, *(number(stats[k], 1) for k in ("median_us", "p99_us", "mean_us")))
        out.title = "MemoryBackend, 1 000 000 per hour, a fake clock:"
        tables.append(out)
    report(args, f"Machine: {about}.", tables, figures)


if __name__ == "__main__":
    main()
