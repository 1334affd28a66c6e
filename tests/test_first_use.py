"""What a newcomer meets first: the rate given with the limiter, rate types and algorithms
as text, and a PER_CLIENT limiter without a client id."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from conftest import Store

import aiolimit
from aiolimit import (
    Algorithm,
    BackendError,
    InvalidArgumentError,
    MemoryBackend,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    ShardedRateLimiter,
)
from aiolimit.asgi import Rule
from aiolimit.backends import base


def count_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names every MemoryBackend writes a config for, in order."""
    writes: list[str] = []
    original = MemoryBackend.set_rate

    async def set_rate(self: MemoryBackend, name: str, *args: Any) -> bool:
        writes.append(name)
        return await original(self, name, *args)

    monkeypatch.setattr(MemoryBackend, "set_rate", set_rate)
    return writes


# -- the rate given with the limiter ---------------------------------------------------------


async def test_the_rate_given_with_the_limiter_is_stored_by_its_first_permit_call(
    store: Store, name: str
) -> None:
    limiter = RateLimiter(name, store.backend(), rate="2/second")
    assert await limiter.get_config() is None  # nothing is written at construction
    assert await limiter.try_acquire()
    assert await limiter.get_config() == RateLimiterConfig.build(RateType.OVERALL, "2/second")
    assert await limiter.try_acquire()
    assert not await limiter.try_acquire()


async def test_the_code_s_rate_replaces_a_stored_one_edit_5_to_10_and_run_again(
    store: Store, name: str
) -> None:
    backend = store.backend()
    await RateLimiter(name, backend).set_rate(
        RateLimiterConfig.build(RateType.OVERALL, 5, 1)
    )  # the earlier run
    limiter = RateLimiter(name, backend, rate="10/second; keep_alive=60")
    assert [await limiter.try_acquire() for _ in range(11)] == [True] * 10 + [False]
    stored = await limiter.get_config()
    assert stored is not None and stored.rate == 10 and stored.keep_alive_us == 60_000_000


@pytest.mark.looptime
async def test_concurrent_first_calls_write_the_config_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writes = count_writes(monkeypatch)
    limiter = RateLimiter("first", MemoryBackend(), rate="10/second")
    assert all(await asyncio.gather(*(limiter.try_acquire() for _ in range(10))))
    assert writes == ["first"]
    await limiter.acquire()  # a second later: no write either
    assert writes == ["first"]


@pytest.mark.looptime
async def test_for_client_views_and_acquire_all_share_the_limiter_s_one_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writes = count_writes(monkeypatch)
    backend = MemoryBackend()
    per_user = RateLimiter("per-user", backend, rate="2/minute; rate_type=per_client")
    everyone = RateLimiter("everyone", backend, rate="100/minute")
    assert await aiolimit.acquire_all([(everyone, 1), (per_user.for_client("alice"), 1)])
    assert await per_user.for_client("bob").try_acquire(2)
    assert not await per_user.for_client("bob").try_acquire()
    assert sorted(writes) == ["everyone", "per-user"]
    assert await everyone.available_permits() == 99


@pytest.mark.looptime
async def test_a_write_that_failed_is_tried_again_by_the_next_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = MemoryBackend.set_rate
    failures = [BackendError("the store is down")]

    async def set_rate(self: MemoryBackend, *args: Any) -> bool:
        if failures:
            raise failures.pop()
        return await original(self, *args)

    monkeypatch.setattr(MemoryBackend, "set_rate", set_rate)
    limiter = RateLimiter("flaky", MemoryBackend(), rate="1/second")
    with pytest.raises(BackendError):
        await limiter.try_acquire()
    limiter.breaker.answered()  # (the outage is over)
    assert await limiter.try_acquire()


async def test_a_sharded_limiter_takes_its_rate_too(store: Store, name: str) -> None:
    limiter = ShardedRateLimiter(name, store.backend(), shards=2, rate="4/minute")
    assert [await limiter.try_acquire() for _ in range(5)] == [True] * 4 + [False]
    stored = await limiter.get_config()
    assert stored is not None and stored.rate == 4


def test_the_rate_arguments_are_checked_at_construction() -> None:
    backend = MemoryBackend()
    with pytest.raises(InvalidArgumentError, match="cannot read the rate"):
        RateLimiter("x", backend, rate="ten per second")
    with pytest.raises(InvalidArgumentError, match="must not be shorter than the interval"):
        RateLimiter("x", backend, rate="10/second; keep_alive=0.5")
    with pytest.raises(InvalidArgumentError, match="interval, algorithm go with rate="):
        RateLimiter("x", backend, interval=1, algorithm="token_bucket")
    with pytest.raises(InvalidArgumentError, match="cannot be split over 3 shards"):
        ShardedRateLimiter("x", backend, shards=3, rate="2/second")


def test_a_missing_argument_names_the_public_class() -> None:
    with pytest.raises(TypeError) as caught:
        RateLimiter("x")  # type: ignore[call-arg]
    assert "RateLimiter.__init__()" in str(caught.value)
    assert "_Limiter" not in str(caught.value)


# -- rate types and algorithms as text --------------------------------------------------------


@pytest.mark.parametrize("text", ["per_client", "PER_CLIENT", "Per_Client", "per-client"])
def test_a_rate_type_is_read_in_any_case(text: str) -> None:
    assert RateType(text) is RateType.PER_CLIENT
    assert RateLimiterConfig.build(text, "1/second").rate_type is RateType.PER_CLIENT


@pytest.mark.parametrize("text", ["token_bucket", "TOKEN_BUCKET", "Token-Bucket"])
def test_an_algorithm_is_read_in_any_case(text: str) -> None:
    assert Algorithm(text) is Algorithm.TOKEN_BUCKET
    config = RateLimiterConfig.build("overall", "1/second", algorithm=text)
    assert config.algorithm is Algorithm.TOKEN_BUCKET
    assert Rule("r", "1/second", algorithm=text).algorithm is Algorithm.TOKEN_BUCKET


def test_an_unknown_name_is_refused_with_what_is_accepted() -> None:
    with pytest.raises(InvalidArgumentError, match="'overall' or 'per_client'"):
        RateLimiterConfig.build("per_user", "1/second")
    accepted = "'sliding_window', 'token_bucket' or 'fixed_window'"
    with pytest.raises(InvalidArgumentError, match=accepted):
        RateLimiterConfig.build("overall", "1/second", algorithm="leaky_bucket")
    with pytest.raises(InvalidArgumentError, match=accepted):
        Rule("r", "1/second", algorithm="leaky_bucket")
    with pytest.raises(InvalidArgumentError, match="'overall' or 'per_client'"):
        RateLimiterConfig.build(3, "1/second")  # type: ignore[arg-type]


# -- PER_CLIENT without a client id ------------------------------------------------------------


def said_random_client(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "without a client_id" in r.getMessage()]


async def test_per_client_without_a_client_id_is_one_budget_per_backend_said_once(
    store: Store, name: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base, "_said_random_client", False)
    caplog.set_level(logging.WARNING, "aiolimit")
    one, other = store.backend(), store.backend()
    if not store.is_redis:  # (the fixture's memory store hands out one backend)
        one, other = MemoryBackend(), MemoryBackend()
        other._shared = one._shared
    first = RateLimiter(name, one, rate="1/minute; rate_type=per_client")
    second = RateLimiter(name, other, rate="1/minute; rate_type=per_client")
    assert await first.try_acquire() and await second.try_acquire()  # a budget each
    assert not await first.try_acquire()
    said = said_random_client(caplog)
    assert len(said) == 1 and repr(name) in said[0] and "for_client" in said[0]


async def test_per_client_with_a_named_client_is_not_warned_about(
    store: Store, name: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base, "_said_random_client", False)
    caplog.set_level(logging.WARNING, "aiolimit")
    limiter = RateLimiter(name, store.backend(), rate="1/minute; rate_type=per_client")
    assert await limiter.for_client("alice").try_acquire()
    named = RateLimiter(name, store.backend(client_id="bob"))
    assert await named.try_acquire()
    assert not await named.try_acquire()
    assert said_random_client(caplog) == []
