"""The config a limiter's code gives it (``RateLimiter(rate=...)``, ``ensure_rate``,
``ShardedRateLimiter(rate=...)``, ``ConcurrencyLimiter(limit=...)``, an ASGI rule's rates) is
the store's while the code runs: written at first use, and written again whenever the store
has lost it (a ``keep_alive`` that ran out while the limiter idled, FLUSHALL, a delete), once
for every caller of the process that found it lost. A limiter whose code gives no config
still finds none, and an operator's rate kept by ``try_set_rate`` stays the operator's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest
from conftest import Store
from redis.asyncio import Redis

import aiolimit
from aiolimit import (
    Backend,
    ConcurrencyConfig,
    ConcurrencyLimiter,
    InvalidArgumentError,
    MemoryBackend,
    NotConfiguredError,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
    ShardedRateLimiter,
)
from aiolimit.asgi import RateLimitMiddleware, Rule
from aiolimit.httpx import RateLimitedTransport
from tools import LocalRedis

looptime = pytest.mark.looptime


def count_calls(monkeypatch: pytest.MonkeyPatch, backend: Backend, method: str) -> list[str]:
    """The names ``method`` (``set_rate``, ``set_limit``) of the backend's class is called
    with, in order: the config writes."""
    names: list[str] = []
    original = getattr(type(backend), method)

    async def counted(self: Backend, name: str, *args: Any) -> Any:
        names.append(name)
        return await original(self, name, *args)

    monkeypatch.setattr(type(backend), method, counted)
    return names


async def lose_every_config(store: Store, *limiters: Any) -> None:
    """The store loses what it held: FLUSHALL on a Redis; in memory, each limiter deleted."""
    backend = store.backend()
    if isinstance(backend, RedisBackend):
        await backend.redis.flushall()
    else:
        for limiter in limiters:
            await limiter.delete()


def config_of(rate: str, keep_alive: float | None = None) -> RateLimiterConfig:
    return RateLimiterConfig.build(RateType.OVERALL, rate, None, keep_alive)


# -- a keep_alive that ran out while the limiter idled ----------------------------------------


@pytest.fixture(
    params=[
        pytest.param("memory", marks=looptime),
        pytest.param("redis", marks=pytest.mark.slow),  # the keys' TTL runs out in real time
    ]
)
async def idle_store(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "memory":
        yield MemoryBackend()
        return
    server: LocalRedis = request.getfixturevalue("redis_server")
    backend = RedisBackend(Redis.from_url(server.url))
    await backend.redis.flushall()
    try:
        yield backend
    finally:
        await backend.aclose()
        await backend.redis.aclose()


def answering(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"ok": True})


async def test_limiters_with_a_rate_and_keep_alive_work_again_after_idling_past_it(
    idle_store: Backend, name: str
) -> None:
    plain = RateLimiter(name, idle_store, rate="5/second; keep_alive=1")
    sharded = ShardedRateLimiter(
        f"{name}-sharded",
        idle_store,
        shards=2,
        rate="4/second; keep_alive=1",
    )
    partner = RateLimiter(
        f"{name}-partner",
        idle_store,
        rate="5/second; keep_alive=1",
    )
    transport = RateLimitedTransport(partner, httpx.MockTransport(answering))
    async with httpx.AsyncClient(transport=transport, base_url="http://partner") as client:
        assert await plain.try_acquire()
        assert await sharded.try_acquire()
        assert (await client.get("/")).status_code == 200
        await asyncio.sleep(1.5)  # idle: every config's TTL has run out
        assert await plain.get_config() is None
        assert await sharded.get_config() is None
        assert [await plain.try_acquire() for _ in range(6)] == [True] * 5 + [False]
        assert await plain.get_config() == config_of("5/second", keep_alive=1)
        assert [await sharded.try_acquire() for _ in range(5)] == [True] * 4 + [False]
        assert (await client.get("/")).status_code == 200
        assert await partner.get_config() == config_of("5/second", keep_alive=1)


# -- a store that lost every config -----------------------------------------------------------


async def test_a_limiter_writes_the_rate_in_code_again_after_a_flushall(
    store: Store, name: str
) -> None:
    limiter = RateLimiter(
        name,
        store.backend(),
        rate="2/minute; keep_alive=60",
    )
    assert await limiter.try_acquire(2)
    await lose_every_config(store, limiter)
    assert [await limiter.try_acquire() for _ in range(3)] == [True, True, False]
    assert await limiter.get_config() == config_of("2/minute", keep_alive=60)


async def test_a_sharded_limiter_writes_every_shard_again_after_a_flushall(
    store: Store, name: str
) -> None:
    limiter = ShardedRateLimiter(name, store.backend(), shards=2, rate="4/minute")
    assert await limiter.try_acquire()
    await lose_every_config(store, limiter)
    assert [await limiter.try_acquire() for _ in range(5)] == [True] * 4 + [False]
    assert await limiter.get_config() == config_of("4/minute")


async def test_the_httpx_transport_goes_on_after_a_flushall(store: Store, name: str) -> None:
    limiter = RateLimiter(name, store.backend(), rate="3/minute")
    transport = RateLimitedTransport(limiter, httpx.MockTransport(answering), timeout=0)
    async with httpx.AsyncClient(transport=transport, base_url="http://partner") as client:
        assert (await client.get("/")).status_code == 200
        await lose_every_config(store, limiter)
        assert [(await client.get("/")).status_code for _ in range(3)] == [200] * 3
        with pytest.raises(aiolimit.RateLimited):
            await client.get("/")


async def test_callers_that_find_the_config_lost_together_write_it_once(
    store: Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = store.backend()
    writes = count_calls(monkeypatch, backend, "set_rate")
    limiter = RateLimiter(name, backend, rate="100/minute")
    assert all(await asyncio.gather(*(limiter.try_acquire() for _ in range(10))))
    assert writes == [name]
    await lose_every_config(store, limiter)
    assert all(await asyncio.gather(*(limiter.try_acquire() for _ in range(10))))
    assert writes == [name, name]
    assert await limiter.available_permits() == 90
    assert all(await asyncio.gather(*(limiter.try_acquire() for _ in range(10))))
    assert writes == [name, name]  # (nothing lost since)


async def test_a_sharded_limiter_s_callers_write_its_shards_once_after_a_loss(
    store: Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = store.backend()
    limiter = ShardedRateLimiter(name, backend, shards=2, rate="100/minute")
    assert await limiter.try_acquire()
    writes = count_calls(monkeypatch, backend, "set_rate")
    await lose_every_config(store, limiter)
    assert all(await asyncio.gather(*(limiter.try_acquire() for _ in range(10))))
    assert sorted(writes) == sorted(shard.name for shard in limiter.shards)


async def test_acquire_all_writes_again_every_config_its_limiters_lost_together(
    store: Store, name: str
) -> None:
    backend = store.backend()
    everyone = RateLimiter(f"{name}-all", backend, rate="10/minute")
    per_user = RateLimiter(f"{name}-user", backend, rate="2/minute; rate_type=per_client")
    requests = [(everyone, 1), (per_user.for_client("alice"), 1)]
    assert await aiolimit.acquire_all(requests)
    await lose_every_config(store, everyone, per_user)
    assert await aiolimit.acquire_all(requests)
    assert await everyone.available_permits() == 9
    assert await per_user.for_client("alice").available_permits() == 1


@looptime
async def test_a_loss_is_repaired_on_every_permit_path() -> None:
    backend = MemoryBackend()
    limiter = RateLimiter("paths", backend, rate="100/minute; rate_type=per_client")

    @limiter.limit
    async def decorated() -> None:
        return None

    async def in_block() -> None:
        async with limiter.for_client("a"):
            pass

    paths: list[Callable[[], Any]] = [
        lambda: limiter.for_client("a").try_acquire(),
        lambda: limiter.for_client("b").acquire(),
        lambda: limiter.for_client("c").reserve(),
        in_block,
        decorated,
        lambda: aiolimit.acquire_all([(limiter.for_client("d"), 1)]),
        lambda: limiter.for_client("e").wait_time(),
        lambda: limiter.for_client("f").available_permits(),
        lambda: limiter.for_client("g").cap_remaining(remaining=1, reset=10),
    ]
    for path in paths:
        await limiter.delete()
        await path()
        assert await limiter.get_config() == RateLimiterConfig.build(
            RateType.PER_CLIENT, "100/minute"
        )


@looptime
async def test_a_sharded_limiter_s_sync_and_wait_time_repair_a_loss() -> None:
    limiter = ShardedRateLimiter("sharded-paths", MemoryBackend(), shards=2, rate="10/minute")
    assert await limiter.wait_time() == 0.0  # the first call writes it
    await limiter.delete()
    await limiter.cap_remaining(remaining=4, reset=60)
    await limiter.delete()
    assert await limiter.wait_time() == 0.0
    assert await limiter.get_config() == config_of("10/minute")


# -- only the code's own rate is written again ------------------------------------------------


async def test_a_limiter_without_a_rate_in_code_still_finds_none(store: Store, name: str) -> None:
    backend = store.backend()
    limiter = RateLimiter(name, backend)
    await limiter.set_rate(
        RateLimiterConfig.build(RateType.OVERALL, 5, 1)
    )  # (an operator's, as `aiolimit set-rate`)
    assert await limiter.try_acquire()
    await lose_every_config(store, limiter)
    with pytest.raises(NotConfiguredError):
        await limiter.try_acquire()
    with pytest.raises(NotConfiguredError):
        await aiolimit.acquire_all([(limiter, 1)])


async def test_a_rate_set_with_try_set_rate_is_not_written_again(store: Store, name: str) -> None:
    backend = store.backend()
    await RateLimiter(name, backend).set_rate(
        RateLimiterConfig.build(RateType.OVERALL, 10, 1)
    )  # the operator's
    limiter = RateLimiter(name, backend)
    assert not await limiter.try_set_rate(
        RateLimiterConfig.build(RateType.OVERALL, 5, 1)
    )  # the code keeps it
    assert [await limiter.try_acquire() for _ in range(11)] == [True] * 10 + [False]
    assert await limiter.get_config() == config_of("10/second")
    await lose_every_config(store, limiter)
    with pytest.raises(NotConfiguredError):
        await limiter.try_acquire()


async def test_a_rate_the_code_ensured_is_written_again_after_a_loss(
    store: Store, name: str
) -> None:
    backend = store.backend()
    limiter = RateLimiter(name, backend)
    view = limiter.for_client("alice")  # (a view made before: it follows its limiter)
    assert await limiter.ensure_rate(RateLimiterConfig.build(RateType.OVERALL, "3/minute"))
    await lose_every_config(store, limiter)
    assert [await view.try_acquire() for _ in range(4)] == [True] * 3 + [False]
    assert await limiter.get_config() == config_of("3/minute")


# -- the ASGI middleware's rules --------------------------------------------------------------


def asgi_app(backend: Backend) -> RateLimitMiddleware:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return RateLimitMiddleware(app, backend=backend, rules=[Rule("api", "100/minute")])


async def test_the_middleware_s_requests_write_a_lost_rule_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = store.backend()
    writes = count_calls(monkeypatch, backend, "set_rate")
    transport = httpx.ASGITransport(asgi_app(backend))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        answers = await asyncio.gather(*(http.get("/") for _ in range(5)))
        assert [a.status_code for a in answers] == [200] * 5
        assert writes == ["api"]
        await lose_every_config(store, RateLimiter("api", backend))
        answers = await asyncio.gather(*(http.get("/") for _ in range(5)))
        assert [a.status_code for a in answers] == [200] * 5
    assert writes == ["api", "api"]
    assert await RateLimiter("api", backend).available_permits() == 95


# -- the concurrency limiter's limit in code --------------------------------------------------


async def test_a_concurrency_limiter_writes_its_limit_at_first_use_and_after_a_loss(
    store: Store, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = store.backend()
    writes = count_calls(monkeypatch, backend, "set_limit")
    sem = ConcurrencyLimiter(name, backend, limit=2, lease=10)
    assert await sem.get_config() is None  # nothing is written at construction
    leases = await asyncio.gather(*(sem.try_lease() for _ in range(3)))
    assert sum(lease is not None for lease in leases) == 2
    assert writes == [name]
    assert await sem.get_config() == ConcurrencyConfig(2, timedelta(seconds=10))
    for lease in leases:
        if lease is not None:
            await lease.release()
    await lose_every_config(store, sem)
    leases = await asyncio.gather(*(sem.try_lease() for _ in range(3)))
    assert sum(lease is not None for lease in leases) == 2
    assert writes == [name, name]
    for lease in leases:
        if lease is not None:
            await lease.release()


async def test_a_concurrency_limiter_s_limit_in_code_replaces_a_stored_one(
    store: Store, name: str
) -> None:
    backend = store.backend()
    await ConcurrencyLimiter(name, backend).set_limit(5)
    sem = ConcurrencyLimiter(name, backend, limit=1)
    lease = await sem.try_lease()
    assert lease is not None
    assert await sem.get_config() == ConcurrencyConfig(1, timedelta(seconds=30))
    assert await sem.try_lease() is None
    await lease.release()


async def test_a_concurrency_limiter_without_a_limit_in_code_still_finds_none(
    store: Store, name: str
) -> None:
    backend = store.backend()
    sem = ConcurrencyLimiter(name, backend)
    await sem.set_limit(2)
    await lose_every_config(store, sem)
    with pytest.raises(NotConfiguredError):
        await sem.try_lease()


def test_a_concurrency_limiter_s_limit_is_checked_at_construction() -> None:
    backend = MemoryBackend()
    with pytest.raises(InvalidArgumentError, match="max_in_flight"):
        ConcurrencyLimiter("x", backend, limit=0)
    with pytest.raises(InvalidArgumentError, match="lease"):
        ConcurrencyLimiter("x", backend, limit=1, lease=0)
    with pytest.raises(InvalidArgumentError, match="lease goes with limit="):
        ConcurrencyLimiter("x", backend, lease=10)
