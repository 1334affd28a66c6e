"""``reserve()`` by hand is paced as a metered HTTP call is: a grant to be settled reserves no
further ahead than ``HORIZON``, one caller of a process at a time, in the order they came,
and a settle for less wakes the next at once. A reservation queued far ahead would keep its
place after the calls before it settle for less. Under looptime on the memory backend (its
clock is the loop's); the same on every store in test_reserve_settle.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from counting import count_calls

from aiolimit import MemoryBackend, RateLimiter, acquire_all
from aiolimit import _pacing as pacing
from aiolimit._pacing import HORIZON, MAX_ASK_HEARING
from aiolimit.backends.base import Attempt, Started

pytestmark = pytest.mark.looptime


def tokens_of(backend: MemoryBackend) -> RateLimiter:
    return RateLimiter("tokens", backend, rate="1000/minute")


async def test_waiting_reserves_book_nothing_beyond_the_horizon() -> None:
    backend = MemoryBackend()
    tokens = tokens_of(backend)
    assert await tokens.reserve(1000)  # the whole budget, for 60 s
    waiting = [asyncio.ensure_future(tokens.reserve(100, timeout=None)) for _ in range(5)]
    await asyncio.sleep(30.0)
    assert not any(each.done() for each in waiting)
    # Five worst cases asked meanwhile, and none is booked at 60 s: 600 more are still due
    # when the first grant leaves the window, not a window later.
    assert await backend.wait_time("tokens", 600) == pytest.approx(30e6, abs=1e3)
    for each in waiting:
        each.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)


async def test_a_settle_for_less_serves_a_waiting_reserve_of_its_process_at_once() -> None:
    loop = asyncio.get_running_loop()
    tokens = tokens_of(MemoryBackend())
    first = await tokens.reserve(1000)
    waiting = asyncio.ensure_future(tokens.reserve(500, timeout=None))
    await asyncio.sleep(1.0)
    settled_at = loop.time()
    await first.settle(100)  # 900 back: the waiting 500 fit now, not in 59 s
    second = await waiting
    assert second
    assert loop.time() - settled_at < 1e-3
    assert second.waited == pytest.approx(1.0, abs=1e-3)


async def test_reserves_of_a_process_are_served_in_the_order_they_came() -> None:
    tokens = tokens_of(MemoryBackend())
    first = await tokens.reserve(1000)
    served: list[str] = []

    async def reserve(name: str, permits: int, after: float) -> None:
        await asyncio.sleep(after)
        if await tokens.reserve(permits, timeout=None):
            served.append(name)

    wanted = {"b": 600, "c": 300, "d": 600, "e": 50}
    callers = [reserve(name, n, 0.1 * i) for i, (name, n) in enumerate(wanted.items(), 1)]

    async def settle() -> None:
        await asyncio.sleep(1.0)
        await first.settle(0)

    await asyncio.gather(settle(), *callers)
    # All back at 1 s: b (600) and c (300) fit; d (600) does not until b's 600 leave the
    # window, and e (50), which would fit, waits behind d rather than pass it.
    assert served == ["b", "c", "d", "e"]


async def test_a_refund_made_elsewhere_is_seen_within_the_longest_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    backend = MemoryBackend()
    tokens = tokens_of(backend)
    held = await tokens.reserve(1000)
    member = held.attempts[0].member  # type: ignore[union-attr]
    calls = count_calls(monkeypatch, backend)

    async def settled_elsewhere() -> None:  # a refund whose message was lost: no wake here
        await asyncio.sleep(30.0)
        await backend.settle("tokens", member, 0)  # (the store tells other clients only)

    began = loop.time()
    settling = asyncio.ensure_future(settled_elsewhere())
    assert await tokens.reserve(10, timeout=None)
    await settling
    # The store tells of refunds made elsewhere: its poll, the bound for a lost message,
    # backs off to MAX_ASK_HEARING (test_refund_wakes.py: the message itself).
    assert 30.0 <= loop.time() - began <= 30.0 + MAX_ASK_HEARING + HORIZON + 1e-3
    # Asking every HORIZON would be 3 000 asks; backing off, about 30 s / MAX_ASK_HEARING.
    asked = calls.count["try_acquire"] + calls.count["start_acquire"]
    assert 30.0 / MAX_ASK_HEARING / 2 <= asked <= 30.0 / MAX_ASK_HEARING + 10, calls.count


async def test_acquire_all_paces_its_grants_too() -> None:
    backend = MemoryBackend()
    tokens, requests = tokens_of(backend), RateLimiter("requests", backend, rate="100/minute")
    first = await acquire_all([(requests, 1), (tokens, 1000)])
    waiting = asyncio.ensure_future(acquire_all([(requests, 1), (tokens, 500)], timeout=None))
    await asyncio.sleep(1.0)
    assert await backend.wait_time("tokens", 600) == pytest.approx(59e6, abs=1e3)
    await first.settle(0, limiter=tokens)
    assert await waiting


async def test_a_release_serves_a_waiting_reserve_of_its_process_at_once() -> None:
    loop = asyncio.get_running_loop()
    tokens = tokens_of(MemoryBackend())
    first = await tokens.reserve(1000)
    waiting = asyncio.ensure_future(tokens.reserve(500, timeout=None))
    await asyncio.sleep(1.0)
    released_at = loop.time()
    await first.release()  # the call was never made: all of it back
    assert await waiting
    assert loop.time() - released_at < 1e-3


async def test_a_timeout_that_cannot_be_met_behind_a_waiting_caller_is_refused_at_once() -> None:
    loop = asyncio.get_running_loop()
    tokens = tokens_of(MemoryBackend())
    assert await tokens.reserve(1000)
    ahead = asyncio.ensure_future(tokens.reserve(500, timeout=None))
    await asyncio.sleep(1.0)  # the caller ahead cannot be granted for 59 s
    began = loop.time()
    refused = await tokens.reserve(10, timeout=30)
    assert not refused and loop.time() - began < 1e-3  # not after waiting its timeout out
    assert 58 < refused.retry_after <= 59
    behind = asyncio.ensure_future(tokens.reserve(10, timeout=120))  # (this one can wait)
    await asyncio.sleep(1.0)
    assert not behind.done()
    for waiting in (ahead, behind):
        waiting.cancel()
    await asyncio.gather(ahead, behind, return_exceptions=True)


async def test_a_waiting_caller_stops_once_the_one_ahead_learns_it_cannot_go_in_time() -> None:
    loop = asyncio.get_running_loop()
    tokens = tokens_of(MemoryBackend())
    assert await tokens.reserve(1000)
    began = loop.time()
    ahead = asyncio.ensure_future(tokens.reserve(500, timeout=None))
    behind = asyncio.ensure_future(tokens.reserve(10, timeout=30))  # queued before it asked
    refused = await behind
    assert not refused and loop.time() - began < 1e-3
    assert 59 < refused.retry_after <= 60
    ahead.cancel()
    await asyncio.gather(ahead, return_exceptions=True)


async def test_a_refund_wakes_the_waiting_caller_only_once_it_may_be_enough(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    backend = MemoryBackend()
    tokens = tokens_of(backend)
    first, second = await tokens.reserve(500), await tokens.reserve(500)
    waiting = asyncio.ensure_future(tokens.reserve(600, timeout=None))
    await asyncio.sleep(1.0)  # refused with nothing left: it lacks 600
    calls = count_calls(monkeypatch, backend)
    await first.settle(400)  # 100 back: not enough, it asks nothing
    await asyncio.sleep(0.001)
    assert calls.count["try_acquire"] + calls.count["start_acquire"] == 0, calls.count
    settled_at = loop.time()
    await second.settle(0)  # 500 more: 600 in all
    assert await waiting
    assert loop.time() - settled_at < 1e-3


async def test_callers_of_two_processes_told_one_time_both_reserve_when_they_ask_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Both wait for the budget's grants to leave the window, told the same time; asking
    # then, the one second reserves the next place (30 ms on) rather than being refused and
    # asking once more.
    loop = asyncio.get_running_loop()
    here = MemoryBackend()
    there = here.with_client("there")  # (another process: turns of its own)
    budget = RateLimiter("partner", here, rate="2/second; margin=0")
    await budget.acquire()
    await asyncio.sleep(0.03)
    await budget.acquire()  # full: one leaves at 1.0 s, the other at 1.03 s
    calls = count_calls(monkeypatch, here)  # (both: the class's calls are counted)
    began = loop.time()
    waiting = [
        asyncio.ensure_future(RateLimiter("partner", backend).reserve(1, timeout=None))
        for backend in (here, there)
    ]
    await asyncio.sleep(0.9)  # (their polls meanwhile: the last at 0.63 s, told 1.0 s)
    asked_before = calls.count["try_acquire"]
    assert all(await asyncio.gather(*waiting))
    assert loop.time() - began == pytest.approx(1.0, abs=0.002)  # (the second slot's start)
    assert calls.count["try_acquire"] - asked_before == 2  # one each, at the store's time


async def test_a_refund_wakes_a_caller_refused_behind_a_grant_booked_just_ahead() -> None:
    # Two processes' callers told one time: the first to ask books the place just ahead, and
    # the store answers the second with less than nothing left (that grant counts already,
    # its room comes as the window moves on). Once it has started, a refund of what the
    # second asks serves it: the refund wakes it then, not its next poll.
    loop = asyncio.get_running_loop()
    here = MemoryBackend()
    there = here.with_client("there")  # (another process: turns of its own)
    budget = RateLimiter("tokens", here, rate="1000/second; margin=0")
    assert await budget.reserve(600)  # leaves the window at 1.0 s
    await asyncio.sleep(0.5)
    held = await budget.reserve(400)  # full until 1.0 s; leaves at 1.5 s
    await asyncio.sleep(0.1)
    waiting = [
        asyncio.ensure_future(RateLimiter("tokens", backend).reserve(400, timeout=None))
        for backend in (here, there)
    ]
    first, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    assert loop.time() == pytest.approx(1.0, abs=0.002)  # (the first slot's start)
    second = next(each for each in waiting if each not in first)
    await asyncio.sleep(0.1)
    assert not second.done()
    settled_at = loop.time()
    await held.settle(0)  # 400 back: what the second asks, and room for it now
    assert await second
    assert loop.time() - settled_at < 1e-3


async def test_a_caller_behind_a_reservation_booked_far_ahead_asks_once_per_refund_of_its_ask(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Less than nothing is left while a plain waiter's reservation is booked far ahead; a
    # paused caller counts it as nothing, so a refund of what it asks wakes it and it is
    # refused (the reservation ahead still needs the room): once per such refund, then it
    # pauses again, with no poll due meanwhile.
    monkeypatch.setattr(pacing, "MAX_ASK_EVERY", 5.0)
    monkeypatch.setattr(pacing, "MAX_ASK_HEARING", 5.0)
    here = MemoryBackend()
    there = here.with_client("there")  # (another process)
    theirs = RateLimiter("tokens", there, rate="1000/minute")
    first, second = await theirs.reserve(500), await theirs.reserve(500)  # full for 60 s
    plain = asyncio.ensure_future(theirs.acquire(1000))  # booked at 60 s
    await asyncio.sleep(1.0)
    waiting = asyncio.ensure_future(RateLimiter("tokens", here).reserve(100, timeout=None))
    await asyncio.sleep(11.0)  # (its polls 5 s apart by now)
    calls = count_calls(monkeypatch, here)  # (both: the class's calls are counted)
    asked = []
    for held in (first, second):
        await held.settle(300)  # 200 back: its ask, not what the reservation ahead needs
        await asyncio.sleep(0.5)
        asked.append(calls.count["try_acquire"] + calls.count["start_acquire"])
    assert asked == [1, 2], calls.count
    assert not waiting.done()
    for task in (waiting, plain):
        task.cancel()
    await asyncio.gather(waiting, plain, return_exceptions=True)


def asks_of(
    monkeypatch: pytest.MonkeyPatch, backend: MemoryBackend
) -> list[tuple[float, int, bool]]:
    """Each attempt ``backend``'s store answers from now on: its time, permits, granted."""
    loop = asyncio.get_running_loop()
    asked: list[tuple[float, int, bool]] = []
    original = MemoryBackend.try_acquire

    async def try_acquire(
        self: MemoryBackend, name: str, permits: int, wait: int | None = 0
    ) -> Attempt:
        answer = await original(self, name, permits, wait)
        asked.append((round(loop.time(), 3), permits, answer.granted))
        return answer

    monkeypatch.setattr(MemoryBackend, "try_acquire", try_acquire)
    return asked


async def queued(tokens: RateLimiter, *asks: tuple[int, float | None]) -> list[asyncio.Future[Any]]:
    """Callers of ``tokens`` asking ``(permits, timeout)``, queued a second apart, once the
    whole budget is reserved (it leaves the window at 60 s)."""
    assert await tokens.reserve(1000)
    waiting = []
    for permits, timeout in asks:
        waiting.append(asyncio.ensure_future(tokens.reserve(permits, timeout=timeout)))
        await asyncio.sleep(1.0)
    return waiting


def no_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Paused callers ask again only when woken or when the store said (no poll between)."""
    monkeypatch.setattr(pacing, "MAX_ASK_EVERY", 1000.0)
    monkeypatch.setattr(pacing, "MAX_ASK_HEARING", 1000.0)


@pytest.mark.parametrize("foresees", [True, False])
async def test_the_caller_behind_a_grant_asks_only_when_the_store_foresaw_it_may_be_granted(
    monkeypatch: pytest.MonkeyPatch, foresees: bool
) -> None:
    # The ask that grants a caller carries a foresight of what the caller behind it asks: it
    # sleeps until then rather than asking at once and being refused. A store that foresees
    # nothing: it asks at once, one call more. The schedule is the same.
    loop = asyncio.get_running_loop()
    no_polls(monkeypatch)
    if not foresees:
        monkeypatch.setattr(MemoryBackend, "start_foresee", lambda *_: None)
    backend = MemoryBackend()
    first, second = await queued(tokens_of(backend), (600, None), (600, None))
    asked = asks_of(monkeypatch, backend)
    assert await first
    assert loop.time() == pytest.approx(60.0, abs=1e-3)
    assert await second
    assert loop.time() == pytest.approx(120.0, abs=1e-3)
    refused_at_once = [(59.995, 600, False)] if not foresees else []
    assert [each for each in asked if 59 < each[0] < 61] == [
        (59.995, 600, True),  # (asked a little before, reserved: DUE_HORIZON)
        *refused_at_once,
    ]
    assert asked[-1] == (119.995, 600, True)  # (asked when the store said)


async def test_a_settle_wakes_a_caller_that_a_foresight_told_to_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    no_polls(monkeypatch)
    backend = MemoryBackend()
    tokens = tokens_of(backend)
    held = await tokens.reserve(1000)
    first = asyncio.ensure_future(tokens.reserve(600, timeout=None))
    second = asyncio.ensure_future(tokens.reserve(500, timeout=None))
    await asyncio.sleep(1.0)
    asked = asks_of(monkeypatch, backend)
    await held.settle(400)  # 600 back: first's, and none left for second (told 59 s)
    granted = await first
    await asyncio.sleep(1.0)
    assert not second.done()
    settled_at = loop.time()
    await granted.settle(100)  # 500 back: what second lacks
    assert await second
    assert loop.time() - settled_at < 1e-3
    assert [each for each in asked if each[0] == 1.0] == [(1.0, 600, True)]  # (told)
    assert asked[-1] == (2.0, 500, True)


async def test_a_foresight_goes_to_no_other_caller_than_the_one_it_was_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The caller next in line is cancelled while the ask carrying its foresight is out: the
    # caller after it (which asks less, and fits at once) asks for itself.
    loop = asyncio.get_running_loop()
    no_polls(monkeypatch)
    backend = MemoryBackend()
    first, second, third = await queued(tokens_of(backend), (600, None), (600, None), (300, None))
    original = MemoryBackend.start_foresee

    def foresee(self: MemoryBackend, name: str, permits: int) -> Started | None:
        if loop.time() > 59:  # (first's ask at the store's time, while it is out)
            second.cancel()
        return original(self, name, permits)

    monkeypatch.setattr(MemoryBackend, "start_foresee", foresee)
    assert await first
    assert await third
    assert loop.time() == pytest.approx(60.0, abs=1e-3)  # not when 600 more would fit
    assert second.cancelled()
    assert await backend.available_permits("tokens") == 100


async def test_a_caller_a_foresight_shows_cannot_go_in_time_is_refused_without_asking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    no_polls(monkeypatch)
    backend = MemoryBackend()
    first, second = await queued(tokens_of(backend), (600, None), (600, 80))  # 81 s: 120 is late
    asked = asks_of(monkeypatch, backend)
    assert await first
    refused = await second
    assert not refused and loop.time() == pytest.approx(60.0, abs=1e-3)
    assert refused.retry_after == pytest.approx(60.0, abs=0.01)
    assert [each for each in asked if each[0] > 59] == [(59.995, 600, True)]  # (first's)
