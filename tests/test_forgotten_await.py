"""A permit call without ``await`` is loud: its result, tested for truth, raises a TypeError
that says to await it (a coroutine is always true: ``if limiter.try_acquire():`` would admit
everything), and the never-awaited warning names the public method, not a private helper.
Awaited, or handed to asyncio as a coroutine, each call works as before."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from aiolimit import (
    ConcurrencyLimiter,
    MemoryBackend,
    RateLimiter,
    ShardedRateLimiter,
    acquire_all,
)

pytestmark = pytest.mark.looptime

Call = Callable[[], Awaitable[Any]]


async def calls() -> dict[str, Call]:
    """Each permit call that returns something a caller tests, on a limiter with nothing left."""
    backend = MemoryBackend()
    empty = RateLimiter("empty", backend, rate="1/min")
    assert await empty.try_acquire()
    unset = RateLimiter("empty", backend)  # (the stored rate, no setup on the first call)
    sharded = ShardedRateLimiter("sharded", backend, shards=2, rate="2/min")
    assert await sharded.try_acquire() and await sharded.try_acquire()
    slots = ConcurrencyLimiter("slots", backend)
    await slots.set_limit(1)
    held = await slots.try_lease()
    assert held is not None
    return {
        "RateLimiter.try_acquire": lambda: empty.try_acquire(),
        "RateLimiter.try_acquire (stored rate)": lambda: unset.try_acquire(),
        "RateLimiter.reserve": lambda: empty.reserve(),
        "RateLimiter.wait_time": lambda: empty.wait_time(),
        "RateLimiter.available_permits": lambda: empty.available_permits(),
        "RateLimiter.acquire": lambda: empty.acquire(),
        "ShardedRateLimiter.try_acquire": lambda: sharded.try_acquire(),
        "ShardedRateLimiter.reserve": lambda: sharded.reserve(),
        "ConcurrencyLimiter.try_lease": lambda: slots.try_lease(),
        "acquire_all": lambda: acquire_all([(empty, 1)]),
    }


NAMES = [
    "RateLimiter.try_acquire",
    "RateLimiter.try_acquire (stored rate)",
    "RateLimiter.reserve",
    "RateLimiter.wait_time",
    "RateLimiter.available_permits",
    "RateLimiter.acquire",
    "ShardedRateLimiter.try_acquire",
    "ShardedRateLimiter.reserve",
    "ConcurrencyLimiter.try_lease",
    "acquire_all",
]


def public_name(name: str) -> str:
    return name.split(" ")[0]


@pytest.mark.parametrize("name", NAMES)
async def test_a_call_not_awaited_raises_type_error_when_tested_for_truth(name: str) -> None:
    call = (await calls())[name]()
    method = public_name(name).split(".")[-1]
    with pytest.raises(TypeError, match=rf"{method}\(\).*coroutine.*await it"):
        bool(call)
    with pytest.raises(TypeError, match="await it"):
        if call:  # the mistake as written
            pass
    await call  # still a call that can be awaited (nothing leaks, nothing warns)


@pytest.mark.parametrize("name", NAMES)
async def test_the_never_awaited_warning_names_the_public_call(name: str) -> None:
    call = (await calls())[name]()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del call
        gc.collect()
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert messages, "no warning"
    assert all(f"'{public_name(name)}' was never awaited" in m for m in messages), messages


@pytest.mark.parametrize("name", NAMES)
async def test_each_call_is_a_coroutine_to_asyncio(name: str) -> None:
    made = await calls()
    call = made[name]()
    assert asyncio.iscoroutine(call)
    call.close()  # type: ignore[attr-defined]  # (a coroutine's: nothing warns)
    task = asyncio.create_task(made[name]())  # type: ignore[arg-type]
    answers = await asyncio.gather(task, made[name](), return_exceptions=True)
    assert not any(isinstance(answer, BaseException) for answer in answers), answers


async def test_an_awaited_call_answers_as_before() -> None:
    limiter = RateLimiter("fresh", MemoryBackend(), rate="2/min")
    assert await limiter.try_acquire() is True
    assert await limiter.wait_time() == 0
    acquired = await limiter.reserve()
    assert acquired
    assert await limiter.try_acquire() is False
    assert await asyncio.create_task(limiter.try_acquire()) is False
