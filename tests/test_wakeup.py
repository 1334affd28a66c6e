"""A waiter wakes at its grant's start on the limiter's clock, mapped to the loop's through
the tightest offset seen (``aiolimit._wakeup``), not ``starts_in`` after it read a reply that
came late: a partner counting arrivals would see late waiters bunch with on-time ones.

On the memory backend under looptime, whose limiter clock is the loop's: a reply held back
after the decision (a slow network, a busy event loop) stands for the lateness.
"""

from __future__ import annotations

import asyncio

import pytest

from aiolimit import MemoryBackend, Observer, RateLimiter, RateLimiterConfig, RateType, observe
from aiolimit.backends import Attempt
from aiolimit.backends._clock import KEPT_FOR, ClockMap

pytestmark = pytest.mark.looptime


class SlowReplies(MemoryBackend):
    """Decides at once, as the store would, then holds each reply back: the n-th call's by
    ``lags[n]`` seconds (0 once they run out)."""

    def __init__(self, lags: list[float]) -> None:
        super().__init__()
        self.lags = lags

    async def try_acquire(self, name: str, permits: int, max_wait_us: int | None = 0) -> Attempt:
        attempt = await super().try_acquire(name, permits, max_wait_us)
        await asyncio.sleep(self.lags.pop(0) if self.lags else 0.0)
        return attempt


class Lateness(Observer):
    def __init__(self) -> None:
        self.samples: list[float] = []

    def late(self, name: str, seconds: float) -> None:
        self.samples.append(seconds)


async def waiters_woke(lags: list[float], rate: int = 4) -> list[float]:
    """``rate`` grants at once, then one waiter per lag, each asking in turn: when each woke,
    from the first grant."""
    backend = SlowReplies([0.0] * rate + lags)
    limiter = RateLimiter("partner", backend)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, rate, 1))
    loop = asyncio.get_running_loop()
    began = loop.time()
    for _ in range(rate):
        await limiter.acquire()
    woke: list[float] = []

    async def waiter() -> None:
        await limiter.acquire()
        woke.append(loop.time() - began)

    tasks = []
    for _ in lags:
        tasks.append(asyncio.create_task(waiter()))
        await asyncio.sleep(0.001)  # (they ask in this order)
    await asyncio.gather(*tasks)
    return woke


async def test_a_reply_read_late_does_not_make_its_waiter_late():
    # Sliding window, 4 per second: the four waiters' slots are all at 1 s. The first reply
    # is read at once; the others 30, 80 and 50 ms after their decision, and each of those
    # waiters slept its wait from the moment it read the reply: 1.03, 1.08, 1.05 s.
    observer = Lateness()
    previous = observe(observer)
    try:
        woke = await waiters_woke([0.0, 0.03, 0.08, 0.05])
    finally:
        observe(previous)
    assert woke == pytest.approx([1.0] * 4, abs=1e-5)
    assert len(observer.samples) == 4 and max(observer.samples) == pytest.approx(0, abs=1e-5)


async def test_without_a_tight_reply_a_waiter_is_never_early():
    # Every reply read late, by different amounts: the tightest bound is the least late
    # one's, so no waiter wakes before its slot, and none later than its own reply says.
    woke = await waiters_woke([0.04, 0.02, 0.06])
    assert all(at >= 1.0 - 1e-6 for at in woke), woke
    assert sorted(woke) == pytest.approx([1.02, 1.02, 1.02], abs=1e-5)


def test_the_map_keeps_the_tightest_offset_and_forgets_old_ones():
    clock_map = ClockMap()
    assert clock_map.local(5_000_000) is None
    clock_map.observe(105_000_000, 100.0)  # decided at 105 s, read at 100: offset >= 5
    clock_map.observe(105_500_000, 101.0)  # read later: a looser bound (4.5), not taken
    assert clock_map.local(200_000_000) == pytest.approx(195.0)
    clock_map.observe(105_200_000, 100.1)  # tighter: 5.1
    assert clock_map.local(200_000_000) == pytest.approx(194.9)
    # An offset is kept for KEPT_FOR / 2 to KEPT_FOR seconds: the clocks may drift.
    half = KEPT_FOR / 2
    clock_map.observe(round((100 + half + 3) * 1e6), 100 + half)  # 3: the older 5.1 stays
    assert clock_map.local(200_000_000) == pytest.approx(194.9)
    clock_map.observe(round((100 + 2 * half + 2) * 1e6), 100 + 2 * half)  # 5.1 is forgotten
    assert clock_map.local(200_000_000) == pytest.approx(197.0)


class SlowBlockReads(SlowReplies):
    """Whether a block came is answered ``read`` seconds after it is asked."""

    read = 0.004

    async def blocked_until(self, name: str) -> int | None:
        await asyncio.sleep(self.read)
        return await super().blocked_until(name)


async def test_asking_whether_a_block_came_does_not_make_a_waiter_late():
    # A waiter asks whether a block() came while it slept; asked at its slot, the read's
    # round trip (4 ms here) made every waiter that late.
    backend = SlowBlockReads([])
    limiter = RateLimiter("partner", backend)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, 1))
    loop = asyncio.get_running_loop()
    began = loop.time()
    await limiter.acquire(2)
    await limiter.acquire()  # its slot: 1 s
    assert loop.time() - began == pytest.approx(1.0, abs=1e-5)


async def test_a_block_that_came_while_the_waiter_slept_is_still_obeyed():
    backend = SlowBlockReads([])
    limiter = RateLimiter("partner", backend)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, 1))
    loop = asyncio.get_running_loop()
    began = loop.time()
    await limiter.acquire(2)

    async def block_soon() -> None:
        await asyncio.sleep(0.5)
        await limiter.pause(2.0)  # until 2.5 s

    blocking = asyncio.create_task(block_soon())
    await limiter.acquire()  # its slot was 1 s: behind the block now
    await blocking
    assert loop.time() - began >= 2.5 - 1e-6
