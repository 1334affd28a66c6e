"""A ``for_client`` view hands back through its parent backend's one set of background tasks:
``aclose()`` of the parent waits for the hand-back of a view's cancelled caller, and the
permit is back in the store once it returns. On memory (the hand-back is a task not run
yet when the caller has gone) and on a real redis-server (writes paused, so the hand-back
stays in flight until the test lets it through)."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from aiolimit import MemoryBackend, RateLimiter, RateLimiterConfig, RateType, RedisBackend
from aiolimit.backends.base import Backend

INTERVAL = 60  # seconds: a reservation starts an interval after the grant before it


async def _a_view_s_caller_waiting(
    backend: Backend, name: str, asleep
) -> tuple[RateLimiter, asyncio.Task[None]]:
    """A PER_CLIENT limiter (1 per INTERVAL) whose client ``alice`` took her permit, and a
    caller of hers sleeping out the next one (reserved, INTERVAL from now)."""
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(RateLimiterConfig.build(RateType.PER_CLIENT, 1, INTERVAL))
    view = limiter.for_client("alice")
    assert await view.try_acquire()
    waiter = asyncio.create_task(view.acquire())
    await asleep.reach(name, 1)
    return view, waiter


async def _cancel(waiter: asyncio.Task[None]) -> None:
    """Cancels the caller: it hands its reservation back in a task of its own, started
    (its first step queued) but not run when this returns."""
    waiter.cancel()
    await asyncio.sleep(0)
    assert waiter.cancelled()


@pytest.mark.looptime
async def test_aclose_of_the_parent_waits_for_a_view_s_hand_back_on_memory(name, asleep):
    backend = MemoryBackend(client_id="service")
    view, waiter = await _a_view_s_caller_waiting(backend, name, asleep)
    await _cancel(waiter)
    # (the store read without yielding: the hand-back has not run, the reservation holds)
    assert await view.backend.wait_time(name, 1) > 1.5 * INTERVAL * 1e6
    await backend.aclose()
    assert await view.backend.wait_time(name, 1) <= INTERVAL * 1e6  # only the first grant


async def test_aclose_of_the_parent_waits_for_a_view_s_hand_back_on_redis(
    redis_server, name, asleep
):
    redis = Redis.from_url(redis_server.url)
    admin = Redis.from_url(redis_server.url)
    backend = RedisBackend(redis)
    grants = backend.keys(name).client_permits("alice")  # alice's log of grants
    try:
        _, waiter = await _a_view_s_caller_waiting(backend, name, asleep)
        assert await admin.zcard(grants) == 2  # her grant and her reservation
        await admin.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")  # holds the hand-back
        try:
            await _cancel(waiter)
            closing = asyncio.create_task(backend.aclose())
            for _ in range(100):  # (ample for a close that waits for nothing to end)
                await asyncio.sleep(0)
            assert not closing.done(), "aclose() did not wait for the view's hand-back"
            assert await admin.zcard(grants) == 2  # (reads pass: the hand-back is held)
        finally:
            await admin.execute_command("CLIENT", "UNPAUSE")
        await asyncio.wait_for(closing, 10)
        assert await admin.zcard(grants) == 1  # back in the store: her grant alone
    finally:
        await redis.aclose()
        await admin.aclose()
