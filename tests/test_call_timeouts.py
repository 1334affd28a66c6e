"""Each call's own deadline: backends with different ``timeout`` options on one Redis client
share its round trips, and each caller still gives up at its own backend's timeout, never at
another's, whatever the order calls arrive in or the round trip that carries them."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from conformance import LoopLag, Tolerance, now, until
from redis.asyncio import Redis

import aiolimit
from aiolimit import BackendError, RateLimiter, RateLimiterConfig, RateType, RedisBackend
from aiolimit.backends.redis._coalescer import coalescer
from tools import LocalRedis

looptime = pytest.mark.looptime

SHORT, LONG = 0.3, 1.2  # as a middleware's small timeout beside an app's default one


class _Silent:
    """A Redis client that never answers (no pipelines: one round trip is ever sent), until
    it is ``gone``: then every call fails."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def _never(self) -> Any:
        await self.gone.wait()
        raise ConnectionError("gone")

    async def execute_command(self, *args: Any) -> Any:
        return await self._never()

    async def evalsha(self, *args: Any) -> Any:
        return await self._never()


@looptime
@pytest.mark.parametrize(
    "timeouts",
    [[2.0, 0.5, 1.0, 0.25, 3.0, 0.5, 0.1], [0.1, 0.5, 0.25, 3.0, 1.0], [3.0, 0.2]],
    ids=["mixed", "mostly-shorter-first", "longer-first"],
)
async def test_every_caller_on_a_shared_client_gives_up_at_its_own_deadline(
    timeouts: list[float],
) -> None:
    silent = _Silent()
    calls = (_failing_after(silent, 0.05 * i, t) for i, t in enumerate(timeouts))
    took = await asyncio.gather(*calls)
    assert took == pytest.approx(timeouts, abs=0.002)


async def _failing_after(silent: _Silent, arrives: float, timeout: float) -> float:
    """How long a call made ``arrives`` seconds from now, on a backend of ``timeout`` on
    ``silent``, waited for its error. (Calls arriving one by one: only the first is sent,
    the others wait behind it.)"""
    await asyncio.sleep(arrives)
    limiter = RateLimiter("silent", RedisBackend(silent, timeout=timeout))
    start = now()
    with pytest.raises(BackendError, match=rf"no reply from Redis within {timeout} s"):
        await limiter.get_config()
    return now() - start


class _RoundTrips(aiolimit.Observer):
    def __init__(self) -> None:
        self.requests: list[int] = []  # each round trip's requests

    def round_trip(self, requests: int) -> None:
        self.requests.append(requests)


@pytest.fixture
def round_trips() -> Iterator[_RoundTrips]:
    recorder = _RoundTrips()
    previous = aiolimit.observe(recorder)
    try:
        yield recorder
    finally:
        aiolimit.observe(previous)


@pytest.fixture
async def frozen_server() -> AsyncIterator[tuple[LocalRedis, Redis]]:
    """A server of the test's own (stopped with SIGSTOP by the test), and a client of it."""
    with LocalRedis() as server:
        redis = Redis.from_url(server.url)
        try:
            yield server, redis
        finally:
            assert server.process is not None
            os.kill(server.process.pid, signal.SIGCONT)
            await redis.aclose()


async def _timed(limiter: RateLimiter) -> tuple[float, float, BaseException | None]:
    """When a call started and ended, and what it raised."""
    start = now()
    try:
        await limiter.try_acquire()
    except BackendError as exc:
        return start, now(), exc
    return start, now(), None


@pytest.mark.slow
@pytest.mark.parametrize("arrival", ["one round trip", "long first", "short first"])
async def test_backends_sharing_a_frozen_client_each_fail_at_their_own_timeout_and_hand_back(
    arrival: str,
    frozen_server: tuple[LocalRedis, Redis],
    round_trips: _RoundTrips,
    loop_lag: LoopLag,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, redis = frozen_server
    assert server.process is not None
    handed_back: list[str] = []
    hand_back = RedisBackend.hand_back

    def recording(self: RedisBackend, name: str, grant: str) -> None:
        handed_back.append(name)
        hand_back(self, name, grant)

    monkeypatch.setattr(RedisBackend, "hand_back", recording)
    short = RateLimiter("shared", RedisBackend(redis, timeout=SHORT))
    long = RateLimiter("shared", RedisBackend(redis, timeout=LONG))
    await short.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, 60))
    round_trips.requests.clear()

    async def sent() -> list[int]:
        return list(round_trips.requests)

    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        first, second = (short, long) if arrival == "short first" else (long, short)
        calls = [asyncio.ensure_future(_timed(first))]
        if arrival != "one round trip":  # the second arrives once the first is under way
            await until(sent, lambda requests: requests == [1], "the first call sent")
        calls.append(asyncio.ensure_future(_timed(second)))
        results = dict(zip((first, second), await asyncio.gather(*calls), strict=True))
        # Both in the first round trip, or the second still waiting behind the first.
        assert round_trips.requests == ([2] if arrival == "one round trip" else [1])
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    tolerance = Tolerance(0.01, 0.15, loop_lag)
    for limiter, timeout in ((short, SHORT), (long, LONG)):
        start, end, error = results[limiter]
        assert isinstance(error, BackendError), error
        assert f"no reply from Redis within {timeout} s" in str(error)
        tolerance.check(end, start + timeout, f"the {timeout} s call's error ({arrival})")
    # Once the server runs again, both requests run and grant: each grant goes back, as
    # nobody waits for it, and the budget is whole again.
    fresh = RateLimiter("shared", RedisBackend(redis))
    await until(fresh.available_permits, lambda left: left == 2, "the late grants handed back")
    assert handed_back == ["shared", "shared"]
    assert [await fresh.try_acquire() for _ in range(3)] == [True, True, False]


@looptime
async def test_a_timeout_no_backend_uses_any_more_leaves_nothing_behind() -> None:
    silent = _Silent()
    timeouts = [0.01 * i for i in range(1, 51)]  # 50 backends, each its own timeout
    calls = (_failing_after(silent, 0.001 * i, t) for i, t in enumerate(timeouts))
    assert await asyncio.gather(*calls) == pytest.approx(timeouts, abs=0.002)
    # The round trip under way ends: its requests (whose errors name their backends) go.
    silent.gone.set()

    async def queues() -> int:
        gc.collect()
        return len(coalescer(silent)._deadlines)

    await until(queues, lambda left: left == 0, "the queues of the backends gone")


class _Op:
    name, what, batch, function = "acquire", "the acquire script", None, None


def test_a_deadline_still_holds_on_the_next_event_loop() -> None:
    """A client used by ``asyncio.run`` after ``asyncio.run`` (a CLI, a test, a worker that
    restarts its loop): a timer left pending when a loop closed must not stand for a timer on
    the next one, or calls there would wait for a reply without a bound."""
    from aiolimit.backends.redis._deadlines import Deadlines

    deadlines = Deadlines(0.05)
    op: Any = _Op()

    async def left_waiting() -> None:
        deadlines.add(asyncio.get_running_loop().create_future(), op, asyncio.get_running_loop())

    async def waits() -> BaseException | None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        deadlines.add(future, op, loop)
        done, _ = await asyncio.wait((future,), timeout=5.0)
        return future.exception() if done else None

    asyncio.run(left_waiting())  # (the loop closes with the timer pending)
    failed = asyncio.run(waits())
    assert isinstance(failed, BackendError), failed
