"""A refund (a settle for less, a release) made by another client of the store -- another
process -- wakes a paced waiter it can serve promptly: on the memory store at once, on a real
redis-server through the limiter's refund channel (pub/sub, the subscription a process's
lease waiters use). A refund too small to serve the waiter wakes no one, so waiters of many
processes do not all ask at every settle. The poll stays the bound for a lost message; here
it is moved out of the way (``MAX_ASK_EVERY``, ``MAX_ASK_HEARING``), so that only a wake-up
is prompt."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from conformance import new_client
from counting import count_calls

from aiolimit import RateLimiter, RedisBackend
from aiolimit import _pacing as pacing

STORES = pytest.mark.parametrize(
    "store", [pytest.param("memory", marks=pytest.mark.looptime), "redis"], indirect=True
)
POLL = 5.0  # the longest pause between two asks, in these tests
PROMPT = 0.3  # how soon, at most, a wake-up is prompt here (real time on a busy machine)


@pytest.fixture(autouse=True)
def slow_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pacing, "MAX_ASK_EVERY", POLL)
    monkeypatch.setattr(pacing, "MAX_ASK_HEARING", POLL)


async def limiters(store: Any) -> tuple[RateLimiter, RateLimiter]:
    """The one tokens limiter, seen by two clients of the store (two processes)."""
    here = RateLimiter("tokens", new_client(store), rate="1000/minute")
    there = RateLimiter("tokens", new_client(store), rate="1000/minute")
    return here, there


async def waiting(limiter: RateLimiter, permits: int) -> asyncio.Task[Any]:
    """A reserve of ``permits`` waiting in its process's turn, paused long by now."""
    task = asyncio.ensure_future(limiter.reserve(permits, timeout=None))
    # Its asks so far at 0.01, 0.03, ... 0.63 and 1.27 s: the next comes at 2.55 s.
    await asyncio.sleep(1.6)
    assert not task.done()
    return task


async def granted_within(task: asyncio.Task[Any], seconds: float) -> float:
    loop = asyncio.get_running_loop()
    began = loop.time()
    acquired = await asyncio.wait_for(task, seconds)
    assert acquired
    return loop.time() - began


@STORES
async def test_a_settle_for_less_elsewhere_wakes_a_waiter_it_serves(store: Any) -> None:
    there, here = await limiters(store)
    held = await there.reserve(1000)
    task = await waiting(here, 500)
    await held.settle(100)  # 900 back, in the other process
    assert await granted_within(task, POLL) < PROMPT


@STORES
async def test_a_release_elsewhere_wakes_a_waiter_it_serves(store: Any) -> None:
    there, here = await limiters(store)
    held = await there.reserve(1000)
    task = await waiting(here, 500)
    await held.release()
    assert await granted_within(task, POLL) < PROMPT


@STORES
async def test_a_refund_too_small_elsewhere_wakes_no_one(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    there, here = await limiters(store)
    small = await there.reserve(400)
    large = await there.reserve(600)
    task = await waiting(here, 500)
    calls = count_calls(monkeypatch, here.backend)
    await small.settle(300)  # 100 back: 500 still lack 500
    await asyncio.sleep(PROMPT)  # (no poll due meanwhile)
    assert not task.done()
    asked = calls.count["try_acquire"] + calls.count["start_acquire"]
    assert asked == 0, calls.count
    await large.settle(200)  # 400 more: 500 back in all, what it lacked
    assert await granted_within(task, POLL) < PROMPT


@pytest.mark.parametrize("store", ["redis"], indirect=True)
async def test_a_settle_tells_the_refund_channel_only_when_it_frees_something(
    store: Any,
) -> None:
    there, here = await limiters(store)
    backend = there.backend
    assert isinstance(backend, RedisBackend)
    channel = f"{backend.keys('tokens').tag}:refunded"
    listener = backend.redis.pubsub()
    await listener.subscribe(channel)
    try:
        held = await there.reserve(500)
        more = await there.reserve(100)
        await more.settle(200)  # more than reserved: nothing freed, nothing said
        await held.settle(100)
        heard = []
        while len(heard) < 2:
            message = await listener.get_message(timeout=PROMPT)
            assert message is not None, heard
            heard.append(message)
        assert heard[0]["type"] == "subscribe"
        assert heard[1]["data"].split()[0] == b"400"
        assert await listener.get_message(timeout=0.1) is None
    finally:
        await listener.aclose()
    del here
