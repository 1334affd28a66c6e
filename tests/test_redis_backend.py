"""Claims only a real Redis (or Valkey) server can prove: key layout, TTLs, script cache,
server clock, ACLs, and how a failing server surfaces. The behaviour every backend shares is
in the conformance suite; these tests look at the keys and the server itself.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources

import fakeredis
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.crc import key_slot
from servers import valkey_server_binary

import aiolimit
from aiolimit import (
    Algorithm,
    Backend,
    BackendError,
    MemoryBackend,
    RateLimiter,
    RateLimiterConfig,
    RateType,
    RedisBackend,
)
from aiolimit.backends import Grant, Refusal
from aiolimit.backends._protocol import (
    format_member,
    parse_grant,
    parse_member,
    parse_value,
    split_life,
)
from tools import LocalRedis, free_port, redis_server_binary

_prefixes = itertools.count()

HOSTILE_NAMES = [
    "plain",
    "{braces}",
    "}{",
    "{",
    "}",
    "{}",
    "a{b}c{d}",
    "%7B",  # must not collide with "{" after escaping
    "%",
    "with spaces and\ttabs",
    "ünïcødé ✓ 名前 🚦",
    "x" * 300,
    "{" * 150 + "}" * 150,
]


@pytest.fixture(params=["redis", "valkey"])
def server(request: pytest.FixtureRequest) -> LocalRedis:
    server: LocalRedis = request.getfixturevalue(f"{request.param}_server")
    return server


@pytest.fixture
async def redis(server: LocalRedis) -> AsyncIterator[Redis]:
    client = Redis.from_url(server.url)
    yield client
    await client.aclose()


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own, so SCAN sees only this test's keys."""
    return f"t{next(_prefixes)}-{os.getpid()}:"


async def scan(redis: Redis, prefix: str) -> list[str]:
    return sorted([key.decode() async for key in redis.scan_iter(match=f"{prefix}*", count=1000)])


def fake_clock(start: float = 1_000.0) -> Callable[[], float]:
    return lambda: start


# -- key layout -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=lambda n: repr(n)[:24])
async def test_every_key_of_a_limiter_is_in_one_cluster_slot(
    redis: Redis, prefix: str, name: str
) -> None:
    first = RedisBackend(redis, client_id="client-{1}", prefix=prefix)
    second = first.with_client("client } 2")
    limiter = RateLimiter(name, first)
    await limiter.set_rate(RateLimiterConfig.build(RateType.PER_CLIENT, 3, 60))
    assert await limiter.try_acquire()
    assert await RateLimiter(name, second).try_acquire(2)
    per_client = await scan(redis, prefix)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 3, 60))
    assert await limiter.try_acquire()
    overall = await scan(redis, prefix)

    keys = first.keys(name)
    expected = {
        keys.config,
        keys.registry,
        keys.client_value("client-{1}"),
        keys.client_permits("client-{1}"),
        keys.client_value("client } 2"),
        keys.client_permits("client } 2"),
    }
    assert set(per_client) == expected
    assert set(overall) == {keys.config, keys.value, keys.permits}
    slots = {key_slot(key.encode()) for key in [*per_client, *overall]}
    assert slots == {key_slot(keys.config.encode())}
    # The slot comes from a non-empty hash tag, not from the whole key.
    tag = re.match(r"[^{]*\{([^}]+)\}", keys.config)
    assert tag is not None
    assert key_slot(keys.config.encode()) == key_slot(tag.group(1).encode())


async def test_different_names_never_share_a_key(redis: Redis, prefix: str) -> None:
    backend = RedisBackend(redis, client_id="c", prefix=prefix)
    seen: dict[str, str] = {}
    for name in HOSTILE_NAMES:
        limiter = RateLimiter(name, backend)
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, 60))
        assert await limiter.try_acquire()
        keys = backend.keys(name)
        for key in (keys.config, keys.value, keys.permits, keys.registry, keys.client_value("c")):
            assert seen.setdefault(key, name) == name, f"{name!r} and {seen[key]!r} share {key!r}"
    assert len(await scan(redis, prefix)) == 3 * len(HOSTILE_NAMES)
    for name in HOSTILE_NAMES:  # each limiter still sees only its own grant
        assert await RateLimiter(name, backend).available_permits() == 1


# -- TTLs ---------------------------------------------------------------------------------------


async def test_state_keys_carry_a_ttl_of_two_intervals_and_config_none(
    redis: Redis, prefix: str
) -> None:
    backend = RedisBackend(redis, client_id="c", prefix=prefix)
    limiter = RateLimiter("ttl", backend)
    keys = backend.keys("ttl")
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 2))
    assert await limiter.try_acquire(2)
    # One interval while the grant counts, one more for keep_state to a longer interval.
    for key in (keys.value, keys.permits):
        assert 3500 < await redis.pttl(key) <= 4000
    assert await redis.pttl(keys.config) == -1

    await limiter.release(1)
    await limiter.update_rate(
        RateLimiterConfig.build(RateType.OVERALL, 5, 3)
    )  # keep_state: TTLs follow the new interval
    for key in (keys.value, keys.permits):
        assert 5500 < await redis.pttl(key) <= 6000

    await limiter.set_rate(RateLimiterConfig.build(RateType.PER_CLIENT, 5, 2))
    assert await limiter.try_acquire()
    for key in (keys.client_value("c"), keys.client_permits("c")):
        assert 3500 < await redis.pttl(key) <= 4000
    # The registry outlives the client keys it lists, so delete/set_rate always find them.
    assert 5500 < await redis.pttl(keys.registry) <= 6000
    assert await redis.pttl(keys.config) == -1
    for key in await scan(redis, prefix):
        assert key == keys.config or await redis.pttl(key) > 0, f"{key} has no TTL"


async def test_a_grant_before_a_reservation_keeps_the_ttl_the_reservation_needs(
    redis: Redis, prefix: str
) -> None:
    # A call that grants sets the TTL from its own grant and the TTL the keys already have:
    # a reservation logged earlier may lie beyond the grant (its started grants handed back,
    # a later request fits now), and the keys must outlive it by two intervals all the same.
    backend = RedisBackend(redis, prefix=prefix)
    keys = backend.keys("queued")
    await RateLimiter("queued", backend).set_rate(RateLimiterConfig.build(RateType.OVERALL, 10, 20))
    first = await backend.try_acquire("queued", 8)
    reserved = await backend.try_acquire("queued", 5, max_wait_us=60_000_000)
    assert isinstance(first, Grant) and isinstance(reserved, Grant)
    assert reserved.starts_in > 19_000_000  # its slot: when the 8 leave the window
    assert await backend.release("queued", 8, first.member) == 8
    assert isinstance(await backend.try_acquire("queued", 1), Grant)  # now, before the reservation
    for key in (keys.value, keys.permits):
        # the reservation's start (~20 s from now) and two intervals: ~60 s, not ~40 s
        assert await redis.pttl(key) > 59_000


async def test_keep_alive_gives_the_config_a_ttl_that_each_grant_slides(
    redis: Redis, prefix: str
) -> None:
    backend = RedisBackend(redis, prefix=prefix)
    limiter = RateLimiter("kept", backend)
    config_key = backend.keys("kept").config
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 1, keep_alive=30))
    assert 29_000 < await redis.pttl(config_key) <= 30_000
    await redis.pexpire(config_key, 500)  # as if 29.5 s had passed
    assert await limiter.try_acquire()
    assert 29_000 < await redis.pttl(config_key) <= 30_000
    assert await limiter.clear_expire()
    assert await redis.pttl(config_key) == -1


@pytest.mark.slow
async def test_an_idle_limiter_keeps_only_its_config_after_its_keep_state_horizon(
    redis: Redis, prefix: str
) -> None:
    backend = RedisBackend(redis, client_id="c", prefix=prefix)
    overall, per_client = RateLimiter("overall", backend), RateLimiter("per-client", backend)
    await overall.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 0.3))
    await per_client.set_rate(RateLimiterConfig.build(RateType.PER_CLIENT, 5, 0.3))
    for limiter in (overall, per_client):
        assert await limiter.try_acquire(3)
    await per_client.release(1)
    # A release leaves a receipt (it makes the release safe to resend) for a minute or more.
    receipts = {key for key in await scan(redis, prefix) if key.endswith(":released")}
    assert len(receipts) == 1
    assert len(await scan(redis, prefix)) == 3 + 4 + 1

    # The state lives HELD_BUCKETS (2) intervals from its newest grant, for set_rate to a
    # longer interval with keep_state; the registry one interval more.
    await asyncio.sleep(0.75)
    keys = backend.keys("per-client")
    configs = {backend.keys("overall").config, keys.config}
    assert set(await scan(redis, prefix)) - {keys.registry} == configs | receipts
    await asyncio.sleep(0.3)
    assert set(await scan(redis, prefix)) == configs | receipts
    assert await overall.available_permits() == 5
    assert await per_client.available_permits() == 5


# -- grant log members --------------------------------------------------------------------------


def grant_ids(members: list[bytes]) -> list[str]:
    return [member.decode().partition(":")[2] for member in members]


def logged_permits(members: list[bytes]) -> int:
    return sum(parse_member(member.decode())[0] for member in members)


async def test_grants_in_one_microsecond_get_unique_members(redis: Redis, prefix: str) -> None:
    backend = RedisBackend(redis, prefix=prefix, clock=fake_clock())
    await backend.set_rate(
        "same", RateLimiterConfig.build(RateType.OVERALL, 1000, 60), "set", False
    )
    permits_key = backend.keys("same").permits
    grants = []
    for i in range(150):
        attempt = await backend.try_acquire("same", 1 + i % 3)
        assert isinstance(attempt, Grant)
        assert attempt.starts_at == 1_000_000_000
        grants.append(attempt.member)
    members = await redis.zrange(permits_key, 0, -1)
    assert len(set(grants)) == len(members) == 150
    logged = {format_member(permits, seq) for permits, _, seq in map(parse_grant, grants)}
    assert {m.decode() for m in members} == logged
    assert logged_permits(members) == sum(1 + i % 3 for i in range(150))

    # Release a part of a grant, a whole grant and an exact grant, then grant again.
    assert await backend.release("same", 4) == 4
    assert grants[10] is not None
    assert await backend.release("same", 2, grants[10]) == parse_grant(grants[10])[0]
    for _ in range(20):
        assert (await backend.try_acquire("same", 2)).granted
    members = await redis.zrange(permits_key, 0, -1)
    assert len(set(members)) == len(members) == 150 - 2 + 20, "a grant was lost or merged"
    _, used, _, _ = parse_value((await redis.get(backend.keys("same").value)).decode())
    assert used == logged_permits(members)
    assert await backend.available_permits("same") == 1000 - used


# -- script cache -------------------------------------------------------------------------------


async def test_every_operation_recovers_after_script_flush(redis: Redis, prefix: str) -> None:
    backend = RedisBackend(redis, prefix=prefix)
    limiter = RateLimiter("flushed", backend)
    steps = [
        lambda: limiter.try_set_rate(RateLimiterConfig.build(RateType.OVERALL, 10, 60)),
        lambda: limiter.try_acquire(2),
        limiter.available_permits,
        lambda: limiter.release(1),
        lambda: limiter.update_rate(RateLimiterConfig.build(RateType.OVERALL, 8, 60)),
        lambda: limiter.expire(60),
        limiter.clear_expire,
        lambda: limiter.set_rate(RateLimiterConfig.build(RateType.PER_CLIENT, 10, 60)),
        lambda: limiter.try_acquire(3),
        limiter.delete,
    ]
    results = []
    for step in steps:
        await redis.script_flush()
        results.append(await step())
    assert results == [True, True, 8, None, True, True, True, None, True, True]


async def test_concurrent_calls_recover_together_after_script_flush(
    redis: Redis, prefix: str
) -> None:
    backend = RedisBackend(redis, prefix=prefix)
    limiter = RateLimiter("flushed", backend)
    await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 30, 60))
    await redis.script_flush()
    granted = await asyncio.gather(*(backend.try_acquire("flushed", 1) for _ in range(40)))
    assert sum(a.granted for a in granted) == 30
    await redis.script_flush()
    assert await asyncio.gather(*(limiter.available_permits() for _ in range(5))) == [0] * 5


@pytest.mark.slow
async def test_thousands_of_concurrent_calls_share_a_few_connections(
    server: LocalRedis, prefix: str
) -> None:
    # Every call, plain reads included, goes through the shared round trips: a client capped
    # at 4 connections serves 2000 limiters configured, read and acquired all at once.
    redis = Redis.from_url(server.url, max_connections=4)
    try:
        backend = RedisBackend(redis, prefix=prefix)
        limiters = [RateLimiter(f"many-{i}", backend) for i in range(2000)]
        await asyncio.gather(
            *(lim.set_rate(RateLimiterConfig.build(RateType.OVERALL, 2, 60)) for lim in limiters)
        )
        configs = await asyncio.gather(*(lim.get_config() for lim in limiters))
        assert all(c is not None and c.rate == 2 for c in configs)
        taken = await asyncio.gather(*(lim.try_acquire(2) for lim in limiters))
        assert all(taken)
        assert not any(await asyncio.gather(*(lim.try_acquire() for lim in limiters)))
    finally:
        await redis.aclose()


def test_scripts_do_not_use_the_lua_struct_library() -> None:
    lua = resources.files("aiolimit.backends.redis") / "lua"
    sources = {f.name: f.read_text() for f in lua.iterdir() if f.name.endswith(".lua")}
    assert len(sources) >= 6
    for file, source in sources.items():
        assert not re.search(r"\bstruct\s*\.", source), f"{file} uses struct"
        assert not re.search(r"\b(cmsgpack|cjson|bit)\s*\.", source), f"{file} uses a C library"


async def test_every_script_runs_on_fakeredis() -> None:
    backend = RedisBackend(fakeredis.FakeAsyncRedis(), client_id="a")
    other = backend.with_client("b")
    limiter = RateLimiter("fake", backend)
    assert await limiter.try_set_rate(RateLimiterConfig.build(RateType.OVERALL, 4, 60))
    assert not await limiter.try_set_rate(RateLimiterConfig.build(RateType.OVERALL, 4, 60))
    assert [await limiter.try_acquire(2) for _ in range(3)] == [True, True, False]
    await limiter.release(1)
    assert await limiter.available_permits() == 1
    assert await limiter.update_rate(RateLimiterConfig.build(RateType.OVERALL, 6, 60))
    assert await limiter.available_permits() == 3
    await limiter.set_rate(RateLimiterConfig.build(RateType.PER_CLIENT, 2, 60, keep_alive=120))
    assert await limiter.try_acquire(2)
    assert await RateLimiter("fake", other).try_acquire(2)
    assert not await limiter.try_acquire()
    assert await limiter.expire(30)
    assert await limiter.clear_expire()
    assert await limiter.delete()
    assert await limiter.get_config() is None


# -- clocks -------------------------------------------------------------------------------------


async def test_the_server_clock_stamps_grants_so_client_clocks_do_not_matter(
    server: LocalRedis, prefix: str
) -> None:
    first = RedisBackend(Redis.from_url(server.url), client_id="first", prefix=prefix)
    second = RedisBackend(Redis.from_url(server.url), client_id="second", prefix=prefix)
    try:
        await RateLimiter("skew", first).set_rate(RateLimiterConfig.build(RateType.OVERALL, 3, 10))
        before = await first.redis.time()
        for _ in range(3):
            assert (await first.try_acquire("skew", 1)).granted
        refused = await second.try_acquire("skew", 1)
        after = await second.redis.time()
        assert isinstance(refused, Refusal)
        # Both clients' attempts carry the server's TIME, whatever their own clocks say.
        server_us = (before[0] * 1_000_000 + before[1], after[0] * 1_000_000 + after[1])
        assert server_us[0] <= refused.at <= server_us[1]
        assert 9_000_000 < refused.retry_in <= 10_000_000
    finally:
        await first.redis.aclose()
        await second.redis.aclose()


@pytest.mark.parametrize("honest_clock", ["server", "client"])
async def test_client_clocks_an_hour_apart_over_admit_which_is_why_server_is_the_default(
    server: LocalRedis, prefix: str, honest_clock: str
) -> None:
    honest = RedisBackend(Redis.from_url(server.url), prefix=prefix, clock=honest_clock)
    ahead = RedisBackend(
        Redis.from_url(server.url), prefix=prefix, clock=lambda: time.time() + 3600
    )
    try:
        await RateLimiter("skew", honest).set_rate(RateLimiterConfig.build(RateType.OVERALL, 3, 10))
        started = time.monotonic()
        assert [(await honest.try_acquire("skew", 1)).granted for _ in range(4)] == [
            True,
            True,
            True,
            False,
        ]
        # The client an hour ahead sees those grants as expired long ago and takes the rate
        # again: 6 grants in one real second on a limiter of 3 per 10 s.
        assert [(await ahead.try_acquire("skew", 1)).granted for _ in range(4)] == [
            True,
            True,
            True,
            False,
        ]
        assert time.monotonic() - started < 10
        locked = await honest.try_acquire("skew", 1)
        assert isinstance(locked, Refusal)
        if honest_clock == "server":
            # Mixed clock modes: the server's TIME sees grants an hour ahead, and the honest
            # client is locked out for about an hour. (Do not mix the modes.)
            assert locked.retry_in > 3_500_000_000
        else:
            # Client times older than the latest one the limiter acted on act at that time:
            # the window goes on from the skewed grants, so the wait is within one interval.
            assert 0 < locked.retry_in <= 10_000_000
    finally:
        await honest.redis.aclose()
        await ahead.redis.aclose()


# -- a server that refuses TIME in scripts ------------------------------------------------------


async def test_a_server_refusing_time_points_to_client_clock(
    server: LocalRedis, redis: Redis, prefix: str
) -> None:
    user = f"no-time-{next(_prefixes)}"
    await redis.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-time")
    limited = Redis.from_url(server.url, username=user, password="pw")
    try:
        admin = RateLimiter("no-time", RedisBackend(redis, prefix=prefix, clock="client"))
        await admin.set_rate(RateLimiterConfig.build(RateType.OVERALL, 3, 60))

        limiter = RateLimiter("no-time", RedisBackend(limited, prefix=prefix))
        for operation in (limiter.try_acquire, limiter.available_permits):
            with pytest.raises(BackendError, match=r"clock='client'") as raised:
                await operation()
            # The server's own words come along (an acquire reports them in its reply).
            assert "TIME" in str(raised.value)
            assert raised.value.__cause__ is None or isinstance(
                raised.value.__cause__, redis_errors.ResponseError
            )

        client_clock = RateLimiter("no-time", RedisBackend(limited, prefix=prefix, clock="client"))
        assert await client_clock.try_acquire(2)
        assert await client_clock.available_permits() == 1
        await client_clock.release(1)
        assert await client_clock.update_rate(RateLimiterConfig.build(RateType.OVERALL, 4, 60))
        assert await client_clock.available_permits() == 3
    finally:
        await limited.aclose()
        await redis.execute_command("ACL", "DELUSER", user)


# -- a server that is gone or hangs -------------------------------------------------------------


def every_operation(limiter: RateLimiter) -> list[tuple[str, Callable[[], object]]]:
    async def enter() -> None:
        async with limiter:
            pass

    return [
        (
            "try_set_rate",
            lambda: limiter.try_set_rate(RateLimiterConfig.build(RateType.OVERALL, 3, 10)),
        ),
        ("set_rate", lambda: limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 3, 10))),
        (
            "update_rate",
            lambda: limiter.update_rate(RateLimiterConfig.build(RateType.OVERALL, 3, 10)),
        ),
        ("get_config", limiter.get_config),
        ("try_acquire", limiter.try_acquire),
        ("try_acquire timeout", lambda: limiter.try_acquire(timeout=1)),
        ("acquire", limiter.acquire),
        ("async with", enter),
        ("available_permits", limiter.available_permits),
        ("release", lambda: limiter.release(1)),
        ("delete", limiter.delete),
        ("expire", lambda: limiter.expire(5)),
        ("clear_expire", limiter.clear_expire),
    ]


@pytest.mark.slow
async def test_an_unreachable_server_raises_backend_error_from_every_operation() -> None:
    redis = Redis.from_url(f"redis://127.0.0.1:{free_port()}", socket_connect_timeout=1)
    limiter = RateLimiter("gone", RedisBackend(redis))
    try:
        for operation, call in every_operation(limiter):
            with pytest.raises(BackendError) as raised:
                await asyncio.wait_for(call(), 5)
            cause = raised.value.__cause__
            assert isinstance(cause, redis_errors.ConnectionError), operation
    finally:
        await redis.aclose()


@pytest.mark.slow
@pytest.mark.parametrize("binary", [redis_server_binary, valkey_server_binary])
async def test_a_server_that_stops_answering_raises_backend_error_after_the_socket_timeout(
    binary: Callable[[], str],
) -> None:
    with LocalRedis(binary=binary()) as own:
        assert own.process is not None
        redis = Redis.from_url(own.url, socket_timeout=0.3)
        # First back-off 0: each call meets the server itself.
        backend = RedisBackend(redis, breaker=aiolimit.BreakerPolicy(first_backoff=0))
        limiter = RateLimiter("hung", backend)
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 3, 10))
        os.kill(own.process.pid, signal.SIGSTOP)
        try:
            for operation, call in every_operation(limiter)[3:8]:
                started = time.monotonic()
                with pytest.raises(BackendError) as raised:
                    await asyncio.wait_for(call(), 5)
                assert isinstance(raised.value.__cause__, redis_errors.TimeoutError), operation
                assert time.monotonic() - started < 2.5, operation
                await redis.connection_pool.disconnect()
        finally:
            os.kill(own.process.pid, signal.SIGCONT)
        # Once the server answers again, so does the limiter.
        assert await limiter.try_acquire()
        own.stop()
        with pytest.raises(BackendError) as raised:
            await limiter.try_acquire()
        assert isinstance(raised.value.__cause__, redis_errors.ConnectionError)
        await redis.aclose()


# -- the memory twin ----------------------------------------------------------------------------


async def redis_state(backend: RedisBackend, name: str, clients: list[str]) -> dict[str, object]:
    """Each budget's permits left and logged (time, permits), and the clients registry."""
    redis, keys = backend.redis, backend.keys(name)
    state: dict[str, object] = {}
    for client, value_key, permits_key in [
        (None, keys.value, keys.permits),
        *((c, keys.client_value(c), keys.client_permits(c)) for c in clients),
    ]:
        entries = await redis.zrange(permits_key, 0, -1, withscores=True)
        value = await redis.get(value_key)
        if value is not None or entries:
            state[str(client)] = (
                None if value is None else parse_value(value.decode())[1],  # permits used
                sorted((int(score), parse_member(m.decode())[0]) for m, score in entries),
            )
    registry = await redis.zrange(keys.registry, 0, -1, withscores=True)
    state["registry"] = sorted((member.decode(), int(score)) for member, score in registry)
    return state


def memory_state(backend: MemoryBackend, name: str) -> dict[str, object]:
    limiter = backend._limiters[name]
    state: dict[str, object] = {  # a grant is (time, its id or member, permits)
        str(client): (budget.used, sorted((grant[0], grant[-1]) for grant in budget.live()))
        for client, budget in limiter.budgets.items()
    }
    state["registry"] = sorted(limiter.registry.items())
    return state


def member_of(attempt: Grant | Refusal) -> str | None:
    """The grant's member, but for its life (each backend's config has its own)."""
    return split_life(attempt.member)[0] if isinstance(attempt, Grant) else None


Script = Callable[[Backend, list[float]], Awaitable[list[str | None]]]


async def twin_run(redis: Redis, prefix: str, script: Script) -> tuple[object, object]:
    """Runs ``script`` on a memory and a Redis backend on one fake clock; returns for each
    the grants the script collected and the state left behind."""
    now = [1_000.0]
    memory = MemoryBackend(client_id="a", clock=lambda: now[0])
    remote = RedisBackend(redis, client_id="a", clock=lambda: now[0], prefix=prefix)
    now[0] = 1_000.0
    from_memory = (await script(memory, now), memory_state(memory, "twin"))
    now[0] = 1_000.0
    from_lua = (await script(remote, now), await redis_state(remote, "twin", ["a", "b"]))
    return from_memory, from_lua


async def test_lua_writes_the_same_state_as_the_memory_twin(redis: Redis, prefix: str) -> None:
    async def script(backend: Backend, now: list[float]) -> list[str | None]:
        other = backend.with_client("b")
        grants = []
        await backend.set_rate("twin", RateLimiterConfig.build("OVERALL", 6, 10), "set", False)
        for step, permits in enumerate([2, 1, 3, 1, 2, 4]):
            now[0] += 0.75 * step
            grants.append(member_of(await backend.try_acquire("twin", permits)))
        await backend.release("twin", 2)  # part of the newest grant
        now[0] += 3
        grants.append(member_of(await backend.try_acquire("twin", 2)))
        await backend.set_rate("twin", RateLimiterConfig.build("OVERALL", 4, 8), "update", True)
        await backend.set_rate("twin", RateLimiterConfig.build("PER_CLIENT", 3, 5), "set", True)
        for client, permits in [(backend, 2), (other, 1), (other, 3), (backend, 1)]:
            now[0] += 0.5
            grants.append(member_of(await client.try_acquire("twin", permits)))
        attempt = await other.try_acquire("twin", 1)
        await other.release("twin", 1, attempt.member)
        now[0] += 12  # every grant expired: reclaim and registry pruning on the next grants
        grants.append(member_of(await backend.try_acquire("twin", 1)))
        grants.append(member_of(await other.try_acquire("twin", 2)))
        return grants

    from_memory, from_lua = await twin_run(redis, prefix, script)
    assert from_lua == from_memory


async def test_lua_and_memory_twin_agree_on_releases_within_one_microsecond(
    redis: Redis, prefix: str
) -> None:
    async def script(backend: Backend, now: list[float]) -> list[str | None]:
        await backend.set_rate("twin", RateLimiterConfig.build("OVERALL", 10, 10), "set", False)
        grants = [member_of(await backend.try_acquire("twin", p)) for p in (2, 1)]
        await backend.release("twin", 1)  # the newest grant is the 1-permit one
        grants.append(member_of(await backend.try_acquire("twin", 1)))
        return grants

    from_memory, from_lua = await twin_run(redis, prefix, script)
    assert from_lua == from_memory


async def test_a_batch_of_many_clients_keeps_the_registry_as_separate_calls_would(
    redis: Redis, prefix: str
) -> None:
    # 40 clients of one PER_CLIENT limiter ask at once (their requests share round trips):
    # each is scored by its own grant, a client whose grant is two intervals old is dropped,
    # and the registry outlives every client's state, as when each asks on its own.
    from conformance import ManualClock

    clock = ManualClock()
    backend = RedisBackend(redis, prefix=prefix, clock=clock)
    limiter = RateLimiter("many", backend)
    keys = backend.keys("many")
    await limiter.set_rate(
        RateLimiterConfig.build(RateType.PER_CLIENT, 3, 10, algorithm=Algorithm.TOKEN_BUCKET)
    )
    assert await limiter.for_client("old").try_acquire()
    clock.advance(21)  # "old"'s grant is more than two intervals old
    clients = [limiter.for_client(f"c{i}") for i in range(40)]
    calls_before = int((await redis.info("commandstats"))["cmdstat_fcall"]["calls"])
    assert all(await asyncio.gather(*(client.try_acquire(2) for client in clients)))
    calls = int((await redis.info("commandstats"))["cmdstat_fcall"]["calls"]) - calls_before
    assert calls < 40  # shared round trips
    start = round(clock() * 1e6)
    registry = await redis.zrange(keys.registry, 0, -1, withscores=True)
    assert sorted(registry) == sorted((f"c{i}".encode(), float(start)) for i in range(40))
    # (each client's state lives until its bucket is full again: 2 tokens of 3 per 10 s)
    state_ttl = await redis.pttl(keys.client_value("c0"))
    assert 6000 < state_ttl <= 6667
    assert state_ttl + 10_000 - 50 < await redis.pttl(keys.registry) <= state_ttl + 10_002


async def script_calls(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_fcall", {}).get("calls", 0))


@pytest.mark.parametrize("algorithm", list(Algorithm))
@pytest.mark.parametrize("rate_type", list(RateType))
async def test_alike_requests_of_one_call_are_granted_until_the_budget_is_out_then_refused(
    redis: Redis, prefix: str, algorithm: Algorithm, rate_type: RateType
) -> None:
    # The tasks of one process asking one limiter alike send equal requests, and one call
    # grants a run of them without deciding each afresh while its budget has room. Once it has
    # none, the rest of the run must come out as calls of their own do: refused, nothing
    # taken. On the server's clock (the default) and an interval no test outlasts, each
    # request must be decided as the memory twin decides it, and as a call of its own is.
    asks = [1] * 3 + [2] + [1] * 4  # two runs of alike requests around another

    async def run(backend: Backend, together: bool) -> list[tuple[bool, int, int | None]]:
        limiter = RateLimiter("one", backend)
        await limiter.set_rate(RateLimiterConfig.build(rate_type, 6, 3600, algorithm=algorithm))
        if together:
            calls_before = await script_calls(redis)
            results = await asyncio.gather(*(backend.try_acquire("one", a) for a in asks))
            assert await script_calls(redis) - calls_before == 1  # all in one call
        else:
            results = [await backend.try_acquire("one", a) for a in asks]
        members = [r.member for r in results if isinstance(r, Grant)]
        assert len(set(members)) == len(members)  # each grant its own member
        assert (await backend.available_permits("one")) == 0
        return [
            (r.granted, r.left, parse_grant(r.member)[0] if isinstance(r, Grant) else None)
            for r in results
        ]

    client_id = "c" if rate_type is RateType.PER_CLIENT else None
    twin = await run(MemoryBackend(client_id=client_id), together=False)
    assert [granted for granted, _, _ in twin] == [True] * 5 + [False] * 3
    for together in (True, False):
        backend = RedisBackend(redis, prefix=f"{prefix}{next(_prefixes)}:", client_id=client_id)
        assert await run(backend, together) == twin


@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize("algorithm", list(Algorithm))
@pytest.mark.parametrize("rate_type", list(RateType))
async def test_a_run_of_alike_grants_comes_back_as_calls_of_their_own_give_it(
    redis: Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    algorithm: Algorithm,
    rate_type: RateType,
    blocked: bool,
) -> None:
    # acquire_many sends most grants of a run of alike requests as short lines ("=" and the
    # tag's step: the grant before it with fewer permits left), which the client writes out.
    # Each must come back exactly as a call of its own gets it: the same start, permits left,
    # rate and member (a hand-back names its grant by the member), with the end of an earlier
    # block where the limiter has one. Both runs on one client clock, so they act at one time.
    from conformance import ManualClock, lifeless

    from aiolimit.backends.redis import _request

    raw: list[bytes] = []
    settle = _request.Call.settle

    def recording(call: _request.Call, reply: object) -> None:
        if call.split is not None and isinstance(reply, bytes):
            raw.append(reply)
        settle(call, reply)

    monkeypatch.setattr(_request.Call, "settle", recording)
    client_id = "c" if rate_type is RateType.PER_CLIENT else None

    async def run(together: bool) -> list[Grant | Refusal]:
        clock = ManualClock()
        backend = RedisBackend(
            redis, prefix=f"{prefix}{next(_prefixes)}:", client_id=client_id, clock=clock
        )
        limiter = RateLimiter("run", backend)
        # 7 permits a second: a token bucket's tag moves by 142 857 or 142 858 us a permit.
        await limiter.set_rate(RateLimiterConfig.build(rate_type, 7, 1, algorithm=algorithm))
        if blocked:
            await limiter.pause(0.5)
            clock.advance(0.5)
        if together:
            return list(await asyncio.gather(*(backend.try_acquire("run", 2) for _ in range(5))))
        return [await backend.try_acquire("run", 2) for _ in range(5)]

    alone = await run(together=False)
    assert [isinstance(r, Grant) for r in alone] == [True] * 3 + [False] * 2
    together = await run(together=True)
    assert [lifeless(r) for r in together] == [lifeless(r) for r in alone]
    (reply,) = raw[-1:]
    assert reply.split(b"\n")[2][:1] == b"="  # the short line was sent, and written out
    if blocked:
        assert all(r.blocked_until is not None for r in together if isinstance(r, Grant))


async def test_a_reply_that_cannot_be_read_fails_each_caller_of_its_call_at_once() -> None:
    # A short line with no grant before it, or fewer lines than requests: every caller of the
    # call gets a BackendError naming the reply, none is left waiting for a reply that came.
    from aiolimit.backends.redis import _request, _scripts

    loop = asyncio.get_running_loop()
    batch = _scripts.ACQUIRE.batch
    assert batch is not None
    for reply in (b"=\n=", b"0 5 0 1 0 1:1:1:L", b"1 5 0 0 1\n=", b"0 5 0 1 0 1:1:x:L\n="):
        requests = [
            _request.Request(
                _scripts.ACQUIRE, [b"k"], [b"1 - 0 OVERALL"], loop.create_future(), None
            )
            for _ in range(2)
        ]
        _request.Call(requests, batch).settle(reply)
        for request in requests:
            with pytest.raises(BackendError, match="unexpected reply to the acquire_many script"):
                request.future.result()


@pytest.mark.parametrize("algorithm", list(Algorithm))
@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    requests=st.lists(
        st.tuples(st.integers(1, 4), st.sampled_from([0, 300_000, None])), min_size=2, max_size=10
    ),
    blocked=st.booleans(),
    later=st.sampled_from([0.1, 0.3, 1.3]),
)
async def test_requests_that_share_one_call_are_decided_as_the_memory_twin_decides_them(
    redis: Redis,
    prefix: str,
    algorithm: Algorithm,
    requests: list[tuple[int, int | None]],
    blocked: bool,
    later: float,
) -> None:
    # Concurrent requests of one limiter go to Redis in one acquire_many call, where most are
    # granted by the short way (a grant now) and the rest by the whole decision (reservations,
    # refusals, a block, a new window). In order, each must come out exactly as the memory
    # twin decides it, and as a call of its own does: the same grant, start, permits left and
    # member, or the same refusal; and the state left must count the same once the interval
    # grows (set_rate with keep_state).
    from conformance import ManualClock, lifeless

    async def run(backend: Backend, clock: ManualClock, together: bool) -> list[object]:
        limiter = RateLimiter("one", backend)
        await limiter.set_rate(RateLimiterConfig.build(RateType.OVERALL, 5, 1, algorithm=algorithm))
        assert (await backend.try_acquire("one", 2)).granted  # a grant logged before
        if blocked:
            await backend.block("one", 200_000)  # over by the time of the requests but for 0.1
        clock.advance(later)  # 1.3: the first grant's window (interval) is over
        if together:
            calls_before = await script_calls(redis)
            results = await asyncio.gather(*(backend.try_acquire("one", *r) for r in requests))
            assert await script_calls(redis) - calls_before == 1  # all made before it went
        else:
            results = [await backend.try_acquire("one", *r) for r in requests]
        await limiter.set_rate(
            RateLimiterConfig.build(RateType.OVERALL, 5, 3, algorithm=algorithm), keep_state=True
        )
        return [*map(lifeless, results), await backend.available_permits("one")]

    clock = ManualClock()
    twin = await run(MemoryBackend(clock=clock), clock, together=False)
    for together in (True, False):
        clock = ManualClock()
        backend = RedisBackend(redis, prefix=f"{prefix}{next(_prefixes)}:", clock=clock)
        assert await run(backend, clock, together) == twin
    # A case where every request is refused compared refusals only: not counted as one.
    assume(any(isinstance(result, Grant) for result in twin) or blocked)
