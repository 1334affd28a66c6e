"""What a grant at once costs this process, counted in steps that do not move with the
machine's load: the frames of aiolimit's own Python code a ``try_acquire`` runs (a call, or a
coroutine, once however often it is resumed), from the call to its answer. Each bound is
what the path takes now; a change that adds a step to it shows here before it shows in
benchmarks/client_cpu.py."""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, FunctionType
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolimit
from aiolimit import (
    Algorithm,
    MemoryBackend,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
)
from tools import LocalRedis

PACKAGE = str(Path(aiolimit.__file__).parent)
GRANTS = 50

# Frames of aiolimit's own code per grant at once, one caller at a time on a token bucket
# (each grant a round trip of its own on Redis, whose last one ends once: hence a fraction).
MOST_FRAMES = {"memory": 60, "redis": 39.5}  # (the breaker's one guard: a frame)


@contextmanager
def counting_frames() -> Iterator[Counter[str]]:
    """Counts the frames of aiolimit's code made in this thread, by function: each call
    once, however often a coroutine of it is resumed (how often a round trip's coroutine
    waits for its reply moves with the machine's load; its calls do not)."""
    entered: Counter[str] = Counter()
    seen: set[FrameType] = set()  # (held: a frame's id is not reused while it is counted)

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(PACKAGE) and frame not in seen:
            seen.add(frame)
            entered[f"{Path(code.co_filename).name}:{code.co_name}"] += 1

    sys.setprofile(profile)
    try:
        yield entered
    finally:
        sys.setprofile(None)


async def _frames_per_grant(limiter: RateLimiter) -> tuple[float, Counter[str]]:
    await limiter.set_rate(
        RateLimiterConfig.build(RateType.OVERALL, 10**9, 1, algorithm=Algorithm.TOKEN_BUCKET)
    )
    for _ in range(GRANTS):  # warm: the rate type learnt, the keys and requests made
        assert await limiter.try_acquire()
    await asyncio.sleep(0)  # (the last round trip's task ends)
    with counting_frames() as entered:
        for _ in range(GRANTS):
            assert await limiter.try_acquire()
        await asyncio.sleep(0)
    return entered.total() / GRANTS, entered


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_a_grant_at_once_runs_few_frames_of_aiolimit_code(
    kind: str, redis_server: LocalRedis
) -> None:
    redis = Redis.from_url(redis_server.url)
    try:
        backend = MemoryBackend() if kind == "memory" else RedisBackend(redis)
        per_grant, entered = await _frames_per_grant(RateLimiter(f"hot-{kind}", backend))
    finally:
        await redis.aclose()
    shown = ", ".join(f"{name} {count / GRANTS:g}" for name, count in entered.most_common())
    assert per_grant <= MOST_FRAMES[kind], f"{per_grant:g} frames a grant: {shown}"


@pytest.mark.parametrize("bad", [{"permits": 0}, {"timeout": -1}, {"timeout": "1s"}])
async def test_a_bad_argument_to_try_acquire_raises_where_it_is_awaited(
    bad: dict[str, Any],
) -> None:
    limiter = RateLimiter("hot-args", MemoryBackend(), rate="5/s")
    call = limiter.try_acquire(**bad)  # made, as an async def's call is, without raising
    assert asyncio.iscoroutine(call)
    with pytest.raises(aiolimit.InvalidArgumentError):
        await call
    task = asyncio.ensure_future(limiter.try_acquire(**bad))
    with pytest.raises(aiolimit.InvalidArgumentError):
        await task
    assert await limiter.try_acquire()  # the rate given at construction, stored at first use


def test_every_permit_call_is_a_coroutine_function_on_every_limiter() -> None:
    # RateLimiter.try_acquire returns the engine's coroutine itself, and the other permit calls
    # an Awaiting of theirs (loud when not awaited): to inspect, each is an async def.
    backend = MemoryBackend()
    calls = ["try_acquire", "reserve", "acquire", "wait_time", "available_permits"]
    limiters: list[Any] = [
        RateLimiter("hot", backend),
        aiolimit.ShardedRateLimiter("hot", backend, shards=2),
    ]
    for limiter in limiters:
        for name in calls:
            call = getattr(limiter, name)
            assert inspect.iscoroutinefunction(call), (limiter, name)
            assert inspect.iscoroutinefunction(getattr(type(limiter), name)), (limiter, name)
            assert asyncio.iscoroutinefunction(call), (limiter, name)
    assert inspect.iscoroutinefunction(aiolimit.ConcurrencyLimiter("hot", backend).try_lease)
    signature = inspect.signature(RateLimiter("hot", backend).try_acquire)
    assert str(signature).startswith("(permits: 'int' = 1, *, timeout:"), signature
    assert "Takes ``permits``" in (RateLimiter.try_acquire.__doc__ or "")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Python 3.10 binds a marked method itself")
def test_every_permit_call_is_a_plain_method_called_as_any_method_is() -> None:
    # Marked as a coroutine function, each is still the function itself on its class: a call
    # binds nothing of its own (a property binding a method per call cost ~1 400 instructions).
    backend = MemoryBackend()
    limiters: list[Any] = [
        RateLimiter("hot", backend),
        aiolimit.ShardedRateLimiter("hot", backend, shards=2),
    ]
    for limiter in limiters:
        for name in ["try_acquire", "reserve", "acquire", "wait_time", "available_permits"]:
            assert isinstance(inspect.getattr_static(limiter, name), FunctionType), (limiter, name)
            assert inspect.iscoroutinefunction(getattr(limiter, name)), (limiter, name)
