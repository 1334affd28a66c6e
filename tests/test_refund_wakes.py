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


async def two_waiting(
    store: Any, own: int
) -> tuple[Any, asyncio.Task[Any], asyncio.Task[Any], Any]:
    """The settling process's grant of 1000 (all the limit), a waiter for ``own`` in that
    same process and one for 500 in another, both paused long by now; and that other's
    store."""
    settler, other = await limiters(store)
    held = await settler.reserve(1000)
    mine = asyncio.ensure_future(settler.reserve(own, timeout=None))
    theirs = asyncio.ensure_future(other.reserve(500, timeout=None))
    await asyncio.sleep(1.6)
    assert not mine.done() and not theirs.done()
    return held, mine, theirs, other.backend


@STORES
async def test_a_refund_its_own_waiter_takes_wakes_no_other_process(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    held, mine, theirs, other = await two_waiting(store, 500)
    asked: list[int] = []
    kind = type(other)
    for method in ("try_acquire", "start_acquire"):  # (the other process's asks only)
        monkeypatch.setattr(kind, method, counted(asked, other, getattr(kind, method)))
    await held.settle(400)  # 600 back: the settler's own waiter takes 500, 100 are told
    assert await granted_within(mine, POLL) < PROMPT
    await asyncio.sleep(PROMPT)  # (no poll due meanwhile)
    assert not theirs.done()
    assert not asked
    theirs.cancel()


def counted(asked: list[int], store: Any, method: Any) -> Any:
    """``method`` of a store's class, noting the permits each call of ``store`` asks."""

    def call(self: Any, name: str, permits: int, *args: Any) -> Any:
        if self is store:
            asked.append(permits)
        return method(self, name, permits, *args)

    return call


@STORES
async def test_a_refund_its_own_waiter_cannot_take_is_told_in_full(store: Any) -> None:
    held, mine, theirs, _ = await two_waiting(store, 900)
    await held.settle(400)  # 600 back: its own waiter lacks 900, the other takes 500
    assert await granted_within(theirs, POLL) < PROMPT
    assert not mine.done()
    mine.cancel()
