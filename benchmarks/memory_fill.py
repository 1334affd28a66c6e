"""MemoryBackend: the cost of one grant as a big window fills.

    python benchmarks/memory_fill.py                   # 1 000, 100 000 and 1 000 000 grants
    python benchmarks/memory_fill.py --at 1000 --at 100000 --json

One OVERALL limiter of 1 000 000 permits per hour on ``MemoryBackend(clock=fake)``, where the
fake clock moves 1 µs forward at every reading, so no grant ever leaves the window and two
grants never share a time. One task calls ``try_acquire()`` (one permit, ``timeout=0``) through
the public ``RateLimiter`` API until the window holds the largest mark. At each mark N, the
next 1 000 grants are timed one by one (``perf_counter_ns`` around the ``await``), and the
median and p99 are reported in µs. The block for the last mark starts at ``rate - 1 000`` when
N is the rate itself (a window holding the whole rate refuses: those 1 000 grants are the ones
that fill it); one more block then times 1 000 refusals on the full window.

Everything runs in this process on one asyncio loop; nothing else is timed. The garbage
collector runs as usual (the median is not affected by its pauses; the p99 may be).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time

import aiolimit
from aiolimit import MemoryBackend, RateLimiter, RateType

RATE = 1_000_000
INTERVAL = 3600.0
BLOCK = 1_000
MARKS = (1_000, 100_000, 1_000_000)


class FakeClock:
    """Seconds; every reading is 1 µs after the previous one."""

    def __init__(self, start_us: int = 1_000_000_000) -> None:
        self.us = start_us

    def __call__(self) -> float:
        self.us += 1
        return self.us / 1_000_000


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_us": ordered[len(ordered) // 2],
        "p99_us": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
        "mean_us": sum(ordered) / len(ordered),
    }


async def fill(marks: list[int]) -> dict[str, object]:
    limiter = RateLimiter("memory-fill", MemoryBackend(clock=FakeClock()))
    await limiter.try_set_rate(RateType.OVERALL, RATE, INTERVAL)
    clock = time.perf_counter_ns
    starts = sorted({min(mark, RATE - BLOCK) for mark in marks})
    results: dict[str, object] = {}
    granted = 0
    began = time.monotonic()
    for start in starts:
        while granted < start:  # fill up to the mark, untimed
            if not await limiter.try_acquire():
                raise SystemExit(f"refused after {granted} grants: the window should hold them")
            granted += 1
            if granted % 100_000 == 0:
                print(
                    f"  {granted:>9,} grants in the window, {time.monotonic() - began:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
        samples = []
        for _ in range(BLOCK):
            before = clock()
            ok = await limiter.try_acquire()
            samples.append((clock() - before) / 1000)
            if not ok:
                raise SystemExit(f"refused after {granted} grants: the window should hold them")
            granted += 1
        shown = results[str(start)] = _stats(samples)
        print(
            f"  grants {start:,}..{start + BLOCK - 1:,}: median {shown['median_us']:.1f} µs, "
            f"p99 {shown['p99_us']:.1f} µs",
            file=sys.stderr,
            flush=True,
        )
    if granted == RATE:  # the window is full: what does a refusal cost?
        samples = []
        for _ in range(BLOCK):
            before = clock()
            ok = await limiter.try_acquire()
            samples.append((clock() - before) / 1000)
            if ok:
                raise SystemExit("granted a permit beyond the rate")
        results["refused_full"] = _stats(samples)
    results["fill_seconds"] = round(time.monotonic() - began, 1)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--at", type=int, action="append", help="grants in the window (repeatable)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args()
    marks = args.at or list(MARKS)
    if any(not BLOCK <= m <= RATE for m in marks):
        parser.error(f"each --at must be between {BLOCK:,} and {RATE:,}")
    print(f"memory_fill: aiolimit from {aiolimit.__file__}", file=sys.stderr)
    results = asyncio.run(fill(marks))
    if args.json:
        print(json.dumps({"aiolimit": aiolimit.__file__, "results": results}, indent=2))
        return
    print(
        f"aiolimit from {aiolimit.__file__}; Python {platform.python_version()}; "
        f"filled in {results['fill_seconds']} s"
    )
    print("| grants in the window | try_acquire µs, median | p99 | mean |")
    print("|--:|--:|--:|--:|")
    for key, value in results.items():
        if not isinstance(value, dict):
            continue
        label = (
            f"{int(key):,}..{int(key) + BLOCK - 1:,}"
            if key.isdigit()
            else f"{RATE:,} (full: refused)"
        )
        print(
            f"| {label} | {value['median_us']:.1f} | {value['p99_us']:.1f} "
            f"| {value['mean_us']:.1f} |"
        )


if __name__ == "__main__":
    main()
