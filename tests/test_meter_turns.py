"""A metered client's calls reserve their estimates only a short way ahead (``HORIZON``), one
caller of a process at a time, in the order they came: an estimate is a worst case, and a
reservation queued far ahead keeps its place after earlier calls settle for less. Under
looptime on the memory backend (its clock is the loop's), through the httpx transport."""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from counting import Calls, count_calls

import aiolimit
from aiolimit import MemoryBackend, Observer, RateLimited, RateLimiter
from aiolimit._pacing import HORIZON, MAX_ASK_HEARING, turns_of
from aiolimit._request import deadline_in
from aiolimit.httpx import RateLimitedTransport

pytestmark = pytest.mark.looptime


def metered(
    backend: MemoryBackend,
    usage: dict[str, int],
    arrivals: list[tuple[str, float]],
    **options: object,
) -> httpx.AsyncClient:
    """A client of a provider that answers after 1 s with ``usage[name]`` tokens used."""
    requests = RateLimiter("turns-requests", backend, rate="100/minute")
    tokens = RateLimiter("turns-tokens", backend, rate="1000/minute")

    async def provider(request: httpx.Request) -> httpx.Response:
        name = json.loads(request.content)["name"]
        arrivals.append((name, asyncio.get_running_loop().time()))
        await asyncio.sleep(1.0)
        return httpx.Response(200, json={"usage": {"total_tokens": usage[name]}})

    def estimate(request: httpx.Request) -> int:
        return int(json.loads(request.content)["estimate"])

    transport = RateLimitedTransport(
        requests, httpx.MockTransport(provider), tokens=tokens, estimate=estimate, **options
    )
    return httpx.AsyncClient(transport=transport, base_url="http://llm.test")


async def call(client: httpx.AsyncClient, name: str, estimate: int, after: float = 0.0) -> None:
    await asyncio.sleep(after)
    await client.post("/v1/chat", json={"name": name, "estimate": estimate})


async def test_a_refund_reaches_the_next_caller_at_once_not_a_window_later() -> None:
    arrivals: list[tuple[str, float]] = []
    async with metered(MemoryBackend(), {"first": 100, "second": 500}, arrivals) as client:
        started = asyncio.get_running_loop().time()
        await asyncio.gather(call(client, "first", 1000), call(client, "second", 500, 0.1))
    when = {name: at - started for name, at in arrivals}
    # The first call takes the whole budget and settles to 100 after 1 s: the second, which
    # a reservation would have put 60 s on, goes within a horizon of the refund.
    assert when["first"] == pytest.approx(0.0, abs=1e-3)
    assert 1.0 <= when["second"] <= 1.0 + HORIZON + 1e-3, when


async def test_a_processs_metered_calls_go_in_the_order_they_came() -> None:
    arrivals: list[tuple[str, float]] = []
    usage = {"first": 0, "b": 600, "c": 300, "d": 600, "e": 50}
    async with metered(MemoryBackend(), usage, arrivals) as client:
        await asyncio.gather(
            call(client, "first", 1000),
            *(call(client, name, usage[name], 0.1 * n) for n, name in enumerate("bcde", 1)),
        )
    # first hands all back at 1 s: b (600) and c (300) fit; d (600) does not until b's 600
    # left the window, and e (50), which would fit, waits behind d rather than pass it.
    order = [name for name, _ in arrivals]
    assert order == ["first", "b", "c", "d", "e"], arrivals


async def test_a_metered_call_that_cannot_have_its_tokens_in_time_is_refused_at_once() -> None:
    arrivals: list[tuple[str, float]] = []
    async with metered(MemoryBackend(), {"first": 1000}, arrivals, timeout=30) as client:
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(call(client, "first", 1000))
        await asyncio.sleep(0.1)
        began = loop.time()
        with pytest.raises(RateLimited) as refused:
            await call(client, "late", 10)  # the budget is spent for 60 s: more than 30
        assert loop.time() - began < HORIZON + 1e-3
        assert 59 < refused.value.retry_after <= 60
        await first


async def test_a_turn_waited_for_ends_at_its_deadline_and_a_cancelled_one_passes_on() -> None:
    loop = asyncio.get_running_loop()
    turns = turns_of([RateLimiter("turns", MemoryBackend(), rate="1/s")])
    assert await turns.wait(None)  # the first has its turn at once
    began = loop.time()
    assert not await turns.wait(deadline_in(2_000_000))  # the turn did not come in 2 s
    assert loop.time() - began == pytest.approx(2.0)
    second = asyncio.ensure_future(turns.wait(None))
    third = asyncio.ensure_future(turns.wait(None))
    await asyncio.sleep(0)
    turns.next()  # the turn passes to the second, which is cancelled as it comes
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert await third  # passed on to the third
    turns.next()
    assert await turns.wait(deadline_in(0))  # nobody holds it: at once


class Outcomes(Observer):
    """What the observer was told of each limiter: grants and refusals."""

    def __init__(self) -> None:
        self.grants: collections.Counter[str] = collections.Counter()
        self.refusals: collections.Counter[str] = collections.Counter()

    def granted(self, name: str, permits: int, waited: float) -> None:
        self.grants[name] += 1

    def refused(self, name: str, permits: int) -> None:
        self.refusals[name] += 1


@pytest.fixture
def outcomes() -> Iterator[Outcomes]:
    observer = Outcomes()
    previous = aiolimit.observe(observer)
    yield observer
    aiolimit.observe(previous)


def asked(calls: Calls) -> int:
    """How many times the meter asked the store: each ask, its tokens alone while they
    refuse, then the two limiters (each alone, or together)."""
    return calls.count["try_acquire"] + calls.count["start_acquire"] // 2


async def test_a_call_held_by_its_request_limiter_sleeps_until_it_not_polling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = MemoryBackend()
    arrivals: list[tuple[str, float]] = []
    async with metered(backend, {"first": 10, "second": 10}, arrivals) as client:
        await call(client, "first", 10)
        await RateLimiter("turns-requests", backend).pause(5.0)  # a 429's pause
        began = asyncio.get_running_loop().time()
        calls = count_calls(monkeypatch, backend)
        await call(client, "second", 10)
    # Token refunds cannot end a pause: the call sleeps it out rather than asking the
    # store every HORIZON meanwhile.
    assert arrivals[1][1] - began == pytest.approx(5.0, abs=HORIZON)
    assert asked(calls) <= 4, calls.count  # (twice: the tokens, then the requests)


async def test_a_waiting_call_sees_a_refund_made_elsewhere_and_asks_less_and_less(
    monkeypatch: pytest.MonkeyPatch, outcomes: Outcomes
) -> None:
    backend = MemoryBackend()
    calls = count_calls(monkeypatch, backend)
    arrivals: list[tuple[str, float]] = []
    async with metered(backend, {"waiting": 10}, arrivals) as client:
        loop = asyncio.get_running_loop()
        # Another process's call holds the whole budget, and settles to 0 after 30 s:
        # a refund this process's meter does not see.
        tokens = RateLimiter("turns-tokens", backend, rate="1000/minute")
        elsewhere = await tokens.reserve(1000)
        assert elsewhere
        began = loop.time()

        async def settled_elsewhere() -> None:
            await asyncio.sleep(30.0)
            await elsewhere.settle(0)

        await asyncio.gather(settled_elsewhere(), call(client, "waiting", 10))
    waited = arrivals[0][1] - began
    # The memory store tells its other clients of refunds: the poll, the bound for a lost
    # message, backs off to MAX_ASK_HEARING.
    assert 30.0 <= waited <= 30.0 + MAX_ASK_HEARING + HORIZON + 1e-3, waited
    # Asking every HORIZON would be 3 000 asks; backing off, about 30 s / MAX_ASK_HEARING.
    assert 30.0 / MAX_ASK_HEARING / 2 <= asked(calls) <= 30.0 / MAX_ASK_HEARING + 10, calls.count
    # However often it asked, the observer saw one call, granted: the refusals on the way
    # were the meter's own, never the caller's.
    assert outcomes.grants["turns-tokens"] == 2  # (the one elsewhere, then the call)
    assert outcomes.refusals == {}, outcomes.refusals


async def test_a_waiting_call_asks_its_tokens_alone_while_they_refuse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = MemoryBackend()
    asked_of: list[str] = []
    attempt = MemoryBackend.try_acquire

    async def counted(self: MemoryBackend, name: str, *args: Any, **kwargs: Any) -> Any:
        asked_of.append(name)
        return await attempt(self, name, *args, **kwargs)

    arrivals: list[tuple[str, float]] = []
    async with metered(backend, {"waiting": 10}, arrivals) as client:
        tokens = RateLimiter("turns-tokens", backend, rate="1000/minute")
        elsewhere = await tokens.reserve(1000)
        monkeypatch.setattr(MemoryBackend, "try_acquire", counted)
        calls = count_calls(monkeypatch, backend)
        waiting = asyncio.ensure_future(call(client, "waiting", 10))
        await asyncio.sleep(5.0)
        # The tokens refuse, asked again and again: the request limiter beside them is
        # not asked meanwhile, so none of its permits is taken and handed back each time.
        assert len(asked_of) > 3 and set(asked_of) == {"turns-tokens"}, asked_of
        assert calls.count["release"] == 0, calls.count
        await elsewhere.settle(0)
        await waiting
    assert asked_of[-2:] == ["turns-tokens", "turns-requests"]
