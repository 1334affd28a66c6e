"""Inputs at the edge of what the scripts handle exactly, inputs that do not encode, and faults
that must be reported within a bound: every one surfaces as an ``aiolimit.LimiterError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis import exceptions as redis_errors
from redis.asyncio import Redis

import aiolimit
from aiolimit import (
    MAX_DURATION,
    MAX_RATE,
    Algorithm,
    Backend,
    BackendError,
    InvalidArgumentError,
    LimiterError,
    MemoryBackend,
    Rate,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
    ShardedRateLimiter,
)
from aiolimit._values import micros, to_micros
from aiolimit.aiohttp import RateLimitedClientMiddleware
from aiolimit.asgi import RateLimitMiddleware
from aiolimit.backends._protocol import MAX_BATCH
from aiolimit.backends.base import Attempt, SetMode
from aiolimit.backends.redis._coalescer import Coalescer, Request, coalescer
from aiolimit.backends.redis._scripts import ACQUIRE, CLIENTS, CONFIG
from aiolimit.fastapi import RateLimit
from aiolimit.httpx import RateLimitedTransport
from tools import LocalRedis

looptime = pytest.mark.looptime


class _NoServer:
    """Stands in for a Redis client where the test never reaches a server."""


class _Untouchable(Backend):
    """A backend no call may reach: the argument checks must refuse first."""

    def __init__(self) -> None:
        super().__init__("untouchable")

    def with_client(self, client_id: str) -> Backend:
        raise AssertionError("reached the backend")

    async def set_rate(
        self, name: str, config: RateLimiterConfig, mode: SetMode, keep_state: bool
    ) -> bool:
        raise AssertionError("reached the backend")

    async def get_config(self, name: str) -> RateLimiterConfig | None:
        raise AssertionError("reached the backend")

    async def try_acquire(self, name: str, permits: int, max_wait_us: int | None = 0) -> Attempt:
        raise AssertionError("reached the backend")

    async def wait_time(self, name: str, permits: int) -> int:
        raise AssertionError("reached the backend")

    async def available_permits(self, name: str) -> int:
        raise AssertionError("reached the backend")

    async def release(self, name: str, permits: int, member: str | None = None) -> int:
        raise AssertionError("reached the backend")

    async def block(self, name: str, duration_us: int | None) -> int:
        raise AssertionError("reached the backend")

    async def delete(self, name: str) -> bool:
        raise AssertionError("reached the backend")

    async def expire(self, name: str, ttl_us: int) -> bool:
        raise AssertionError("reached the backend")

    async def clear_expire(self, name: str) -> bool:
        raise AssertionError("reached the backend")


def assert_invalid(caught: pytest.ExceptionInfo[BaseException]) -> None:
    assert isinstance(caught.value, InvalidArgumentError), repr(caught.value)
    assert isinstance(caught.value, LimiterError)


# -- numbers the scripts handle exactly ----------------------------------------------------------

TOO_BIG_RATES = [MAX_RATE + 1, 2**53 + 1, 10**30, 2**63, 10**5000]


def test_the_bounds_are_what_lua_holds_exactly() -> None:
    assert 8 * MAX_RATE <= 2**53  # a budget's queued reservations stay exact
    # a config at both bounds is accepted
    config = RateLimiterConfig.build(RateType.OVERALL, MAX_RATE, MAX_DURATION, MAX_DURATION)
    assert (config.rate, config.interval, config.keep_alive) == (
        MAX_RATE,
        MAX_DURATION,
        MAX_DURATION,
    )
    assert config.interval_us == micros(MAX_DURATION) and 2 * config.interval_us < 2**53


@pytest.mark.parametrize(
    "rate", TOO_BIG_RATES, ids=["2**50+1", "2**53+1", "1e30", "2**63", "1e5000"]
)
@pytest.mark.filterwarnings("ignore:.*rate_type, rate:DeprecationWarning")  # still checked
async def test_rates_above_max_rate_are_refused_naming_the_bound(rate: int) -> None:
    limiter = RateLimiter("big", _Untouchable())
    sharded = ShardedRateLimiter("big", _Untouchable(), shards=2)
    for set_rate in (
        limiter.try_set_rate,
        limiter.set_rate,
        limiter.update_rate,
        sharded.try_set_rate,
        sharded.set_rate,
        sharded.update_rate,
    ):
        with pytest.raises(InvalidArgumentError, match=str(MAX_RATE)) as caught:
            await set_rate(RateType.OVERALL, rate, 1)  # type: ignore[operator]
        assert_invalid(caught)
        assert len(str(caught.value)) < 200


@pytest.mark.parametrize(
    "permits", TOO_BIG_RATES, ids=["2**50+1", "2**53+1", "1e30", "2**63", "1e5000"]
)
async def test_permits_above_max_rate_are_refused_before_any_backend_call(permits: int) -> None:
    limiter = RateLimiter("big", _Untouchable())
    sharded = ShardedRateLimiter("big", _Untouchable(), shards=2)
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: limiter.try_acquire(permits),
        lambda: limiter.try_acquire(permits, timeout=None),
        lambda: limiter.acquire(permits),
        lambda: limiter.release(permits),
        lambda: sharded.try_acquire(permits),
        lambda: sharded.acquire(permits),
        lambda: sharded.release(permits),
    ]
    for call in calls:
        with pytest.raises(InvalidArgumentError, match=str(MAX_RATE)) as caught:
            await call()
        assert_invalid(caught)
        assert len(str(caught.value)) < 200


TOO_LONG = [
    1e303,
    10**400,
    1e13,
    timedelta.max,
    MAX_DURATION + timedelta(microseconds=1),
    MAX_DURATION.total_seconds() + 1,
]
TOO_LONG_IDS = ["1e303", "1e400-int", "1e13", "timedelta.max", "max+1us", "max+1s"]


@pytest.mark.parametrize("duration", TOO_LONG, ids=TOO_LONG_IDS)
async def test_durations_above_max_duration_are_refused(duration: Any) -> None:
    limiter = RateLimiter("long", _Untouchable())
    with pytest.raises(InvalidArgumentError, match=r"interval.*10 years") as caught:
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, duration))
    assert_invalid(caught)
    with pytest.raises(InvalidArgumentError, match=r"keep_alive.*10 years"):
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 1, keep_alive=duration))
    with pytest.raises(InvalidArgumentError, match=r"ttl.*10 years"):
        await limiter.expire(duration)
    sharded = ShardedRateLimiter("long", _Untouchable(), shards=2)
    with pytest.raises(InvalidArgumentError, match=r"interval.*10 years"):
        await sharded.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, duration))
    with pytest.raises(InvalidArgumentError, match=r"ttl.*10 years"):
        await sharded.expire(duration)


@pytest.mark.parametrize(
    "value",
    [*TOO_LONG, -1e303, -(10**400), timedelta.min],
    ids=[*TOO_LONG_IDS, "-1e303", "-1e400", "min"],
)
def test_to_micros_refuses_out_of_range_durations_without_overflow(value: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="10 years") as caught:
        to_micros(value, "duration")
    assert len(str(caught.value)) < 200


async def test_expire_far_in_the_future_is_refused_and_the_limiter_keeps_limiting(
    store: Any, name: str
) -> None:
    limiter = RateLimiter(name, store.backend())
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, 60))
    for ttl in (1e13, timedelta.max, 10**20):
        with pytest.raises(InvalidArgumentError):
            await limiter.expire(ttl)
    assert await limiter.expire(MAX_DURATION)
    assert [await limiter.try_acquire() for _ in range(3)] == [True, True, False]
    assert await limiter.get_config() is not None


@looptime
@pytest.mark.parametrize(
    "timeout",
    [1e303, 10**400, math.inf, timedelta.max, MAX_DURATION + timedelta(microseconds=1)],
    ids=["1e303", "1e400-int", "inf", "timedelta.max", "max+1us"],
)
async def test_timeouts_above_max_duration_wait_as_long_as_it_takes(timeout: Any) -> None:
    backend = MemoryBackend()
    limiter = RateLimiter("wait", backend)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1, 10))
    sharded = ShardedRateLimiter("wait", backend, shards=2)
    await sharded.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, 10))  # a permit per shard
    loop = asyncio.get_running_loop()
    assert [await sharded.try_acquire(), await sharded.try_acquire()] == [True, True]
    assert await limiter.try_acquire()
    start = loop.time()
    waits = [one.try_acquire(1, timeout=timeout) for one in (limiter, sharded)]
    assert await asyncio.gather(*waits) == [True, True]
    assert 9.9 < loop.time() - start <= 10.001


@pytest.mark.parametrize(
    "timeout",
    [
        -1,
        -1e303,
        -(10**400),
        math.nan,
        -math.inf,
        timedelta.min,
        timedelta(microseconds=-1),
        -1e-7,
        -5e-7,
        -1e-300,
    ],
    ids=[
        "-1",
        "-1e303",
        "-1e400",
        "nan",
        "-inf",
        "timedelta.min",
        "-1us",
        "-0.1us",
        "-0.5us",
        "-1e-300",
    ],
)
async def test_negative_and_nan_timeouts_are_refused(timeout: Any) -> None:
    for limiter in (
        RateLimiter("t", _Untouchable()),
        ShardedRateLimiter("t", _Untouchable(), shards=2),
    ):
        with pytest.raises(InvalidArgumentError, match="timeout") as caught:
            await limiter.try_acquire(1, timeout=timeout)
        assert_invalid(caught)


@pytest.mark.parametrize("timeout", [-1e-7, -5e-7, -1e-300, -1, math.nan])
async def test_every_surface_refuses_any_negative_timeout(timeout: float) -> None:
    limiter = RateLimiter("t", _Untouchable())
    surfaces: list[Callable[[], object]] = [
        lambda: limiter.limit(timeout=timeout),
        lambda: RateLimitedTransport(limiter, timeout=timeout),
        lambda: RateLimitedClientMiddleware(limiter, timeout=timeout),
        lambda: RateLimitMiddleware(_no_app, backend=_Untouchable(), rules=[], wait=timeout),
        lambda: RateLimit("t", "1/second", backend=_Untouchable(), wait=timeout),
    ]
    for make in surfaces:
        with pytest.raises(InvalidArgumentError, match=r"timeout|wait") as caught:
            make()
        assert_invalid(caught)
    with pytest.raises(InvalidArgumentError, match="timeout"):
        await aiolimit.acquire_all([(limiter, 1)], timeout=timeout)


async def _no_app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("reached the app")


# -- names that do not encode --------------------------------------------------------------------

UNENCODABLE = ["\ud800", "api\udfff", "\udcff-x"]


@pytest.mark.parametrize("bad", UNENCODABLE, ids=range(len(UNENCODABLE)))
def test_text_that_does_not_encode_is_refused_at_construction(bad: str) -> None:
    for make in (
        lambda: RateLimiter(bad, MemoryBackend()),
        lambda: RateLimiter(bad, RedisBackend(_NoServer())),
        lambda: ShardedRateLimiter(bad, MemoryBackend(), shards=2),
        lambda: ShardedRateLimiter(bad, RedisBackend(_NoServer()), shards=2),
        lambda: MemoryBackend(client_id=bad),
        lambda: MemoryBackend().with_client(bad),
        lambda: RedisBackend(_NoServer(), client_id=bad),
        lambda: RedisBackend(_NoServer()).with_client(bad),
        lambda: RedisBackend(_NoServer(), prefix=bad),
    ):
        with pytest.raises(InvalidArgumentError, match="UTF-8") as caught:
            make()
        assert_invalid(caught)


async def test_a_bad_name_at_the_backend_fails_only_its_own_call(redis_server: LocalRedis) -> None:
    redis = Redis.from_url(redis_server.url)
    backend = RedisBackend(redis, prefix="bad-name:")
    try:
        good = RateLimiter("good", backend)
        await good.set_rate(RateLimiterConfig.build(RateType.OVERALL, 1000, 60))
        bad_calls: list[Awaitable[object]] = [
            backend.try_acquire("\ud800", 1),
            backend.get_config("\ud800"),
            backend.available_permits("\ud800"),
            backend.delete("\ud800"),
        ]
        # Queue good calls around the bad ones so they would share one round trip.
        results = await asyncio.gather(
            *[good.try_acquire() for _ in range(20)],
            *bad_calls,
            *[good.try_acquire() for _ in range(20)],
            return_exceptions=True,
        )
        assert results[:20] == [True] * 20
        assert results[-20:] == [True] * 20
        for result in results[20:-20]:
            assert isinstance(result, InvalidArgumentError), repr(result)
        assert await good.available_permits() == 960
    finally:
        await redis.aclose()


async def test_the_coalescer_refuses_what_does_not_encode_in_the_callers_own_call(
    redis_server: LocalRedis,
) -> None:
    redis = Redis.from_url(redis_server.url)
    pipe = coalescer(redis)

    async def call(operation: Any, keys: list[Any], args: list[Any]) -> Any:
        return await pipe.submit(operation, keys, args)

    try:
        script = CONFIG
        results = await asyncio.gather(
            *[call(script, [b"coalesce:ok"], []) for _ in range(10)],
            call(script, ["coalesce:\ud800"], []),
            call(CLIENTS, [b"coalesce:ok"], [0, "\udfff"]),
            *[call(script, [b"coalesce:ok"], []) for _ in range(10)],
            return_exceptions=True,
        )
        assert all(not isinstance(r, BaseException) for r in results[:10] + results[-10:])
        for result in results[10:12]:
            assert isinstance(result, InvalidArgumentError), repr(result)
    finally:
        await redis.aclose()


# -- raw exceptions where a LimiterError is promised ---------------------------------------------


@pytest.mark.parametrize(
    "client_id", ["", 5, b"id", object()], ids=["empty", "int", "bytes", "object"]
)
def test_bad_client_ids_raise_invalid_argument_error(client_id: Any) -> None:
    for make in (
        lambda: MemoryBackend(client_id=client_id),
        lambda: MemoryBackend().with_client(client_id),
        lambda: RedisBackend(_NoServer(), client_id=client_id),
        lambda: RedisBackend(_NoServer()).with_client(client_id),
    ):
        with pytest.raises(InvalidArgumentError, match="client_id") as caught:
            make()
        assert_invalid(caught)


@pytest.mark.parametrize(
    "prefix", [None, 5, b"x:", "{x}:", "a}"], ids=["none", "int", "bytes", "braces", "brace"]
)
def test_bad_prefixes_raise_invalid_argument_error(prefix: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="prefix") as caught:
        RedisBackend(_NoServer(), prefix=prefix)
    assert_invalid(caught)


@pytest.mark.parametrize("clock", [None, 5, "later"], ids=["none", "int", "str"])
def test_a_clock_that_is_not_callable_is_refused(clock: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="clock"):
        MemoryBackend(clock=clock)
    with pytest.raises(InvalidArgumentError, match="clock"):
        RedisBackend(_NoServer(), clock=clock)


BAD_READINGS = [math.nan, math.inf, -math.inf, 1e300, "1000", None, True]
BAD_READING_IDS = ["nan", "inf", "-inf", "1e300", "str", "none", "bool"]


@pytest.mark.parametrize("reading", BAD_READINGS, ids=BAD_READING_IDS)
async def test_a_clock_reading_that_is_not_a_time_raises_at_the_call(
    store: Any, name: str, reading: Any
) -> None:
    now: list[Any] = [1000.0]
    limiter = RateLimiter(name, store.backend(clock=lambda: now[0]))
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 10))
    now[0] = reading
    for call in (
        limiter.try_acquire,
        limiter.available_permits,
        lambda: limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 10)),
        lambda: limiter.expire(5),
    ):
        with pytest.raises(InvalidArgumentError, match="clock") as caught:
            await call()  # type: ignore[operator]
        assert_invalid(caught)
    now[0] = 1000.0
    assert await limiter.available_permits() == 5


LUA_ERRORS = [
    # Redis 7 / Valkey: error() from our own scripts
    (
        "user_script:12: aiolimit: the state in k is not aiolimit state; delete() the limiter "
        "script: 2a27acc4ac364ebd02aa7c2b958a9aa5ae038eef, on @user_script:12.",
        "aiolimit: the state in k is not aiolimit state; delete() the limiter",
    ),
    # an error table, and redis.error_reply
    (
        "aiolimit: table script: 24b94d04ddd685e06049fc8162de736a49549d11, on @user_script:1.",
        "aiolimit: table",
    ),
    ("aiolimit: reply", "aiolimit: reply"),
    # a command refused inside the script
    (
        "WRONGTYPE Operation against a key holding the wrong kind of value script: "
        "e6a137537cdfe1ac5c729590ad2a426444f71f07, on @user_script:1.",
        "WRONGTYPE Operation against a key holding the wrong kind of value",
    ),
    # a Lua runtime error
    (
        "user_script:1: attempt to index local 'x' (a nil value) script: "
        "cf0efd7895bbde8aab6ffbb44ec6bca4bd5ef4c3, on @user_script:1.",
        "attempt to index local 'x' (a nil value)",
    ),
    # Redis 6
    (
        "Error running script (call to f_2a27acc4ac364ebd02aa7c2b958a9aa5ae038eef): "
        "@user_script:12: user_script:12: aiolimit: bad state",
        "aiolimit: bad state",
    ),
    (
        "ERR Error running script (call to f_2a27acc4ac364ebd02aa7c2b958a9aa5ae038eef): "
        "@user_script:3: WRONGTYPE Operation against a key holding the wrong kind of value",
        "WRONGTYPE Operation against a key holding the wrong kind of value",
    ),
]


class _Refusing:
    """A Redis client that refuses every command with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def execute_command(self, *args: Any) -> Any:
        raise self.error


@pytest.mark.parametrize(("raw", "reason"), LUA_ERRORS, ids=range(len(LUA_ERRORS)))
async def test_backend_errors_say_the_operation_and_the_reason_without_lua_noise(
    raw: str, reason: str
) -> None:
    cause = redis_errors.ResponseError(raw)
    backend = RedisBackend(_Refusing(cause))
    config = RateLimiterConfig(RateType.OVERALL, 5, timedelta(seconds=10))
    with pytest.raises(BackendError) as caught:
        await backend.set_rate("noise", config, "set", keep_state=False)
    assert str(caught.value) == f"Redis refused the set_rate script: {reason}"
    assert caught.value.__cause__ is cause


async def test_a_script_error_from_a_real_server_reads_plainly(redis_server: LocalRedis) -> None:
    redis = Redis.from_url(redis_server.url)
    backend = RedisBackend(redis, prefix="lua-noise:")
    limiter = RateLimiter("wrong-type", backend)
    try:
        await redis.delete(backend.keys("wrong-type").config)
        await redis.set(backend.keys("wrong-type").config, "not a hash")
        for call in (
            lambda: limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 10)),
            limiter.available_permits,
            limiter.get_config,
            lambda: limiter.expire(5),
        ):
            with pytest.raises(BackendError) as caught:
                await call()  # type: ignore[operator]
            message = str(caught.value)
            assert "user_script" not in message, message
            assert not re.search("script: [0-9a-f]{40}", message), message
            assert isinstance(caught.value.__cause__, redis_errors.ResponseError)
            assert str(caught.value.__cause__) != message
    finally:
        await redis.delete(backend.keys("wrong-type").config)
        await redis.aclose()


@pytest.mark.slow
def test_the_backend_remembers_at_most_about_10000_limiters() -> None:
    backend = RedisBackend(_NoServer())
    names = [f"limiter-{i}" for i in range(100_000)]
    for name in names:
        backend.keys(name)
        backend._types[name] = RateType.OVERALL
    assert len(backend._keys) <= 10_000
    assert len(backend._types) <= 10_000
    # the oldest go first: the newest are still remembered, not cleared wholesale
    newest = backend.keys(names[-1])
    backend.keys("one more")
    assert backend.keys(names[-1]) is newest
    assert names[-2] in backend._types
    assert names[0] not in backend._types


# -- a deadline on faults ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "timeout",
    [0, -1, math.nan, -math.inf, "5", True, timedelta(0), timedelta(seconds=-1)],
    ids=["0", "-1", "nan", "-inf", "str", "bool", "timedelta-0", "timedelta-negative"],
)
def test_the_timeout_option_must_be_positive_seconds_or_none(timeout: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="timeout") as caught:
        RedisBackend(_NoServer(), timeout=timeout)
    assert_invalid(caught)


def test_the_timeout_option_defaults_to_5_s_and_survives_with_client() -> None:
    assert RedisBackend(_NoServer()).timeout == 5.0
    assert RedisBackend(_NoServer(), timeout=None).timeout is None
    assert RedisBackend(_NoServer(), timeout=math.inf).timeout is None
    assert RedisBackend(_NoServer(), timeout=2).timeout == 2.0
    assert RedisBackend(_NoServer(), timeout=timedelta(milliseconds=1500)).timeout == 1.5
    assert RedisBackend(_NoServer(), timeout=0.25).with_client("other").timeout == 0.25


class _SlowRedis:
    """A Redis client that answers after ``delay`` seconds with ``reply`` (an exception is
    raised). No pipelines: every test here sends one call at a time."""

    def __init__(self, delay: float, reply: Any) -> None:
        self.delay = delay
        self.reply = reply
        self.calls = 0

    async def _answer(self) -> Any:
        self.calls += 1
        await asyncio.sleep(self.delay)
        if isinstance(self.reply, BaseException):
            raise self.reply
        return self.reply

    async def execute_command(self, *args: Any) -> Any:
        return await self._answer()

    async def evalsha(self, *args: Any) -> Any:
        return await self._answer()


@looptime
async def test_a_call_without_a_reply_fails_at_the_backend_timeout() -> None:
    slow = _SlowRedis(3600, [])
    backend = RedisBackend(slow, timeout=0.5)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(BackendError, match=r"no reply from Redis within 0\.5 s"):
        await RateLimiter("slow", backend).get_config()
    assert loop.time() - start == pytest.approx(0.5, abs=0.01)


@looptime
async def test_resends_stop_about_a_second_after_the_first_failure() -> None:
    # Each attempt fails after 0.6 s (as redis-py does after its own retries): one resend
    # still fits in the second after the first failure, a second one would not.
    slow = _SlowRedis(0.6, redis_errors.ConnectionError("Connection refused"))
    backend = RedisBackend(slow, timeout=None)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(BackendError) as caught:
        await RateLimiter("down", backend).get_config()
    assert isinstance(caught.value.__cause__, redis_errors.ConnectionError)
    elapsed = loop.time() - start
    assert elapsed <= 0.6 + 1.0 + 0.01, elapsed
    assert slow.calls <= 2


@looptime
async def test_an_attempt_slower_than_the_resend_window_is_not_sent_again() -> None:
    slow = _SlowRedis(4.0, redis_errors.ConnectionError("Connection refused"))
    backend = RedisBackend(slow, timeout=None)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(BackendError):
        await RateLimiter("down", backend).get_config()
    assert loop.time() - start == pytest.approx(4.0, abs=0.01)
    assert slow.calls == 1


@looptime
async def test_fast_failures_are_still_sent_again_while_a_server_restarts() -> None:
    slow = _SlowRedis(0.001, redis_errors.ConnectionError("Connection refused"))
    backend = RedisBackend(slow, timeout=None)
    with pytest.raises(BackendError):
        await RateLimiter("restarting", backend).get_config()
    assert slow.calls == 5  # at once, then after 20, 100 and 300 ms


@pytest.mark.slow
async def test_a_paused_server_fails_the_call_within_the_timeout_and_the_grant_is_handed_back(
    redis_server: LocalRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed_back: list[tuple[str, str]] = []
    hand_back = RedisBackend.hand_back

    def recording(self: RedisBackend, name: str, grant: str) -> None:
        handed_back.append((name, grant))
        hand_back(self, name, grant)

    monkeypatch.setattr(RedisBackend, "hand_back", recording)
    redis = Redis.from_url(redis_server.url)
    admin = Redis.from_url(redis_server.url)
    backend = RedisBackend(redis, timeout=0.5, prefix="paused:")
    limiter = RateLimiter("paused", backend)
    try:
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 60))
        await admin.execute_command("CLIENT", "PAUSE", 3000, "ALL")
        paused = time.monotonic()
        with pytest.raises(BackendError, match=r"no reply from Redis within 0\.5 s"):
            await limiter.try_acquire(timeout=0)
        assert 0.45 <= time.monotonic() - paused <= 1.5
        # After the pause the script runs and grants; the grant is handed back.
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(BackendError):  # no reply while the pause lasts
                if await limiter.available_permits() == 5:
                    break
            assert time.monotonic() < deadline, "the late grant was never handed back"
            await asyncio.sleep(0.05)
        assert time.monotonic() - paused >= 2.9
        assert [name for name, _ in handed_back] == ["paused"]
        assert [await limiter.try_acquire() for _ in range(6)] == [True] * 5 + [False]
        await limiter.delete()
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")
        await admin.aclose()
        await redis.aclose()


async def _time_to_fail(call: Callable[[], Awaitable[object]]) -> tuple[float, BaseException]:
    start = time.monotonic()
    with pytest.raises(Exception) as caught:  # any failure: we time it
        await asyncio.wait_for(call(), 60)
    assert not isinstance(caught.value, asyncio.TimeoutError)
    return time.monotonic() - start, caught.value


@pytest.mark.slow
async def test_a_stopped_server_is_reported_about_as_soon_as_redis_py_reports_it() -> None:
    server = LocalRedis().start()
    clients = [Redis(host="127.0.0.1", port=server.port) for _ in range(5)]
    try:
        limiters = [
            RateLimiter("down", RedisBackend(clients[0])),
            RateLimiter("down", RedisBackend(clients[1], timeout=None)),
        ]
        for limiter in limiters:
            await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 60))
        for plain in clients[2:]:
            await plain.ping()
        server.stop()
        # All at once, each on its own client. redis-py's retries back off with jitter, so
        # its own time to give up varies by a second or more: take the longest of three.
        timed = await asyncio.gather(
            *[_time_to_fail(limiter.try_acquire) for limiter in limiters],
            *[_time_to_fail(lambda plain=plain: plain.get("x")) for plain in clients[2:]],
        )
        alone = max(seconds for seconds, _ in timed[2:])
        for seconds, error in timed[:2]:
            assert isinstance(error, BackendError), repr(error)
            assert seconds <= alone + 1.5, (seconds, alone)
    finally:
        server.stop()
        for client in clients:
            await client.aclose()


# -- no script runs for long ---------------------------------------------------------------------


async def test_a_large_batch_of_acquires_is_split_into_calls_of_at_most_64(
    redis_server: LocalRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[list[tuple[str, int]]] = []
    round_trip = Coalescer._round_trip

    async def recording(self: Any, calls: list[Any]) -> list[Any]:
        sent.append([(call.operation.name, len(call.requests)) for call in calls])
        return await round_trip(self, calls)

    monkeypatch.setattr(Coalescer, "_round_trip", recording)
    redis = Redis.from_url(redis_server.url)
    backend = RedisBackend(redis, prefix="split:")
    limiter = RateLimiter("split", backend)
    try:
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 150, 60))
        results = await asyncio.gather(*[limiter.try_acquire() for _ in range(300)])
        # Request order is kept across the split: the first 150 callers get the permits.
        assert results == [True] * 150 + [False] * 150
        sizes = [size for batch in sent for name, size in batch if name.startswith("acquire")]
        assert sum(sizes) == 300
        assert max(sizes) <= 64
        assert len(sizes) < 300 / 16  # the calls were shared, many per round trip
        await limiter.delete()
    finally:
        await redis.aclose()


async def test_requests_over_many_limiters_go_in_two_round_trips_in_flight_each_limiter_in_one(
    redis_server: LocalRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two round trips in flight at once (so Redis runs one while this process prepares the
    # next), but a limiter's requests never in both: they may reach Redis in either order,
    # and a limiter serves its callers in the order they asked.
    flying: list[set[bytes]] = []
    overlaps: list[set[bytes]] = []
    most_in_flight = 0
    round_trip = Coalescer._round_trip

    async def recording(self: Any, calls: list[Any]) -> list[Any]:
        nonlocal most_in_flight
        limiters = {call.requests[0].keys[0] for call in calls}
        limiters |= {request.keys[0] for call in calls for request in call.requests}
        overlaps.extend(limiters & other for other in flying if limiters & other)
        flying.append(limiters)
        most_in_flight = max(most_in_flight, len(flying))
        try:
            return await round_trip(self, calls)
        finally:
            flying.remove(limiters)

    monkeypatch.setattr(Coalescer, "_round_trip", recording)
    redis = Redis.from_url(redis_server.url)
    backend = RedisBackend(redis, prefix="flight:")
    limiters = [RateLimiter(f"flight-{i}", backend) for i in range(40)]
    try:
        for limiter in limiters:
            await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 60))
        # 10 requests per limiter, interleaved: 400 at once, then again as callers return.
        asks = [limiters[i % 40] for i in range(400)]
        results = await asyncio.gather(*[limiter.try_acquire() for limiter in asks])
        for i, limiter in enumerate(limiters):
            # each limiter's first 5 callers got its 5 permits, in the order they asked
            assert results[i::40] == [True] * 5 + [False] * 5, limiter.name
        assert most_in_flight == 2
        assert overlaps == []
    finally:
        await redis.aclose()


def test_acquire_requests_go_in_calls_of_at_most_max_batch() -> None:
    pipe = Coalescer(_NoServer())
    loop = asyncio.new_event_loop()
    try:
        requests = [
            Request(
                ACQUIRE,
                [b"k1", b"k2", b"k3"],
                [f"1 - 0 OVERALL {i}".encode()],
                loop.create_future(),
                None,
            )
            for i in range(130)
        ]
    finally:
        loop.close()
    calls = pipe._calls(requests)
    assert [len(c.requests) for c in calls] == [MAX_BATCH, MAX_BATCH, 130 - 2 * MAX_BATCH]
    assert [c.operation.name for c in calls] == ["acquire_many"] * 3
    assert [r for c in calls for r in c.requests] == requests
    single = pipe._calls(requests[:65])
    assert [(c.operation.name, len(c.requests)) for c in single] == [
        ("acquire_many", 64),
        ("acquire", 1),
    ]


# -- shards live in a name space of their own ----------------------------------------------------


@pytest.mark.parametrize(
    "name", ["a\x00b", "\x00", "api\x00shard0"], ids=["inside", "alone", "shard"]
)
def test_plain_names_may_not_contain_nul(name: str) -> None:
    for make in (
        lambda: RateLimiter(name, MemoryBackend()),
        lambda: ShardedRateLimiter(name, MemoryBackend(), shards=2),
        lambda: ShardedRateLimiter(name, RedisBackend(_NoServer()), shards=2),
    ):
        with pytest.raises(InvalidArgumentError, match="NUL") as caught:
            make()
        assert_invalid(caught)


def test_shard_keys_are_readable_and_out_of_reach_of_plain_names() -> None:
    backend = RedisBackend(_NoServer())
    assert backend.keys("api\x00shard0").config == "aiolimit:{api%00shard0}:config"
    assert backend.keys("api%00shard0").config == "aiolimit:{api%2500shard0}:config"
    names = [shard.name for shard in ShardedRateLimiter("api", backend, shards=3).shards]
    assert all(n.startswith(f"api\x00shard{i}") for i, n in enumerate(names))
    memory = ShardedRateLimiter("api", MemoryBackend(), shards=2)
    assert [shard.name for shard in memory.shards] == ["api\x00shard0", "api\x00shard1"]


async def test_a_plain_limiter_named_like_a_shard_shares_nothing_with_the_sharded_one(
    store: Any,
) -> None:
    backend = store.backend()
    sharded = ShardedRateLimiter("api", backend, shards=2)
    plain = [RateLimiter(f"api#shard{i}", backend) for i in range(2)]
    assert await sharded.try_set_rate(RateLimiterConfig.build(RateType.OVERALL, 4, 60))
    for limiter in plain:
        assert await limiter.get_config() is None
        assert await limiter.try_set_rate(RateLimiterConfig.build(RateType.OVERALL, 10, 60))
    assert [await sharded.try_acquire() for _ in range(5)] == [True] * 4 + [False]
    assert [await limiter.available_permits() for limiter in plain] == [10, 10]
    assert await plain[0].try_acquire(10)
    assert await sharded.available_permits() == 0
    await sharded.delete()
    assert [await limiter.get_config() is not None for limiter in plain] == [True, True]
    if store.is_redis:
        keys = {key.decode() async for key in backend.redis.scan_iter(match="aiolimit:*")}  # type: ignore[attr-defined]
        assert keys and all("#shard" in key for key in keys), keys


@pytest.mark.parametrize("algorithm", list(Algorithm), ids=lambda a: a.name.lower())
async def test_foreign_fields_in_a_config_hash_change_nothing_the_scripts_do(
    redis_server: LocalRedis, algorithm: Algorithm
) -> None:
    # The scripts read a config hash whole: fields that are not a config's (written by
    # another hand, or named like what a script works out from the config) neither send its
    # writes to another key nor change its rate; rates that are not rates are a typed error.
    redis = Redis.from_url(redis_server.url)
    backend = RedisBackend(redis, prefix="foreign:")
    limiter = RateLimiter("fields", backend)
    config = backend.keys("fields").config
    try:
        await limiter.set_rate(
            RateLimiterConfig.build(RateType.OVERALL, 3, 60, algorithm=algorithm)
        )
        await redis.hset(
            config,
            mapping={"key": "foreign:elsewhere", "max_permits": "99", "longest": "1", "x": "y"},
        )
        assert [await limiter.try_acquire() for _ in range(4)] == [True] * 3 + [False]
        with pytest.raises(InvalidArgumentError):
            await limiter.try_acquire(4)
        assert await redis.exists("foreign:elsewhere") == 0
        await redis.hset(config, "rates", "not rates")
        with pytest.raises(BackendError, match="not an aiolimit config"):
            await limiter.try_acquire()
        # A hash of many fields is not a config either (the scripts' loop over it is bounded).
        # (Another backend: this one's breaker has just seen the store fail.)
        limiter = RateLimiter("fields", RedisBackend(redis, prefix="foreign:"))
        await limiter.set_rate(
            RateLimiterConfig.build(RateType.OVERALL, 3, 60, algorithm=algorithm)
        )
        await redis.hset(config, mapping={f"field-{i}": i for i in range(40)})
        with pytest.raises(BackendError, match="not an aiolimit config"):
            await limiter.try_acquire()
    finally:
        await redis.delete(*(await redis.keys("foreign:*")))
        await redis.aclose()


# -- rates as text -------------------------------------------------------------------------------

_MAX_US = int(MAX_DURATION.total_seconds()) * 1_000_000


@settings(max_examples=400, deadline=None)
@given(
    permits=st.one_of(st.integers(1, 1000), st.integers(1, MAX_RATE)),
    interval_us=st.one_of(
        st.integers(1, 1000),  # below a millisecond
        st.integers(1, _MAX_US),
        st.sampled_from([1, 99, 100_000, 1_000_000, 60_000_000, 86_400_000_000, _MAX_US]),
    ),
)
def test_str_of_a_rate_always_reads_back_as_the_same_rate(permits: int, interval_us: int) -> None:
    rate = Rate(permits, timedelta(microseconds=interval_us))
    assert Rate.parse(str(rate)) == (rate,)


@pytest.mark.parametrize(
    ("interval_us", "text"),
    [(50, "7/0.00005 seconds"), (1, "7/0.000001 seconds"), (1_500_000, "7/1.5 seconds")],
)
def test_str_of_a_rate_below_a_millisecond_is_plain_decimal_seconds(
    interval_us: int, text: str
) -> None:
    assert str(Rate(7, timedelta(microseconds=interval_us))) == text
