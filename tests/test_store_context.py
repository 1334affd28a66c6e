"""One context per store, shared by its ``with_client`` views, owns the breakers, the clock
maps and every background task, so that ``aclose()`` waits for all of them: a lease handed
back for a holder cancelled while its attempt was in flight, and an aiohttp event stream's
settle, on memory (the store's call held until the test lets it through) and on a real
redis-server (writes paused). A view's hand-back: ``test_view_hand_backs.py``. And the
contract split: a concurrency limiter refuses a store without leases when it is made."""

from __future__ import annotations

import ast
import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from redis.asyncio import Redis

import aiolimit.backends
from aiolimit import (
    Backend,
    BreakerPolicy,
    ConcurrencyLimiter,
    InvalidArgumentError,
    MemoryBackend,
    RateLimiter,
    RateType,
    RedisBackend,
)
from aiolimit.aiohttp import RateLimitedClientMiddleware
from aiolimit.backends import LeaseStore, Settlement

PROMPT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
USED = 42


class Held(MemoryBackend):
    """A memory store whose lease releases and settles wait until ``opened`` is set."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.opened = asyncio.Event()

    async def release_lease(self, name: str, lease_id: str) -> bool:
        await self.opened.wait()
        return await super().release_lease(name, lease_id)

    async def settle(self, name: str, member: str, permits: int, *, kept: int = 0) -> Settlement:
        await self.opened.wait()
        return await super().settle(name, member, permits, kept=kept)


async def _closes_only_once_let_through(
    store: Backend, let_through: Callable[[], Awaitable[None]]
) -> None:
    """``store.aclose()`` does not return while a call of its background task is held; it
    returns once the call is let through."""
    closing = asyncio.create_task(store.aclose())
    for _ in range(100):  # (ample for a close that waits for nothing to end)
        await asyncio.sleep(0)
    assert not closing.done(), "aclose() did not wait for the store's background task"
    await let_through()
    await asyncio.wait_for(closing, 10)


class WritesHeld:
    """Holds every write on a real server (``CLIENT PAUSE ... WRITE``) until let through."""

    def __init__(self, url: str) -> None:
        self._admin = Redis.from_url(url)

    async def hold(self) -> None:
        await self._admin.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")

    async def let_through(self) -> None:
        await self._admin.execute_command("CLIENT", "UNPAUSE")

    async def aclose(self) -> None:
        await self.let_through()
        await self._admin.aclose()


async def _cancelled_while_taking(sem: ConcurrencyLimiter) -> None:
    """A caller of ``sem.try_lease()`` cancelled once its attempt is under way: the lease
    the attempt takes is the store's to hand back, in the background."""
    caller = asyncio.create_task(sem.try_lease())
    for _ in range(3):  # (its attempt is sent at its first step)
        await asyncio.sleep(0)
    caller.cancel()
    await asyncio.gather(caller, return_exceptions=True)
    assert caller.cancelled()


# -- a lease of a cancelled holder -------------------------------------------------------------


async def test_aclose_waits_for_the_lease_of_a_holder_cancelled_while_taking_it_on_memory(name):
    backend = Held()
    sem = ConcurrencyLimiter(name, backend)
    await sem.set_limit(1)
    await _cancelled_while_taking(sem)
    assert (await sem.leases()).in_flight == 1  # (held: its release waits to be let through)

    async def let_through() -> None:
        backend.opened.set()

    await _closes_only_once_let_through(backend, let_through)
    assert (await sem.leases()).in_flight == 0


async def test_aclose_waits_for_the_lease_of_a_holder_cancelled_while_taking_it_on_redis(
    redis_server, name
):
    redis = Redis.from_url(redis_server.url)
    backend = RedisBackend(redis)
    try:
        sem = ConcurrencyLimiter(name, backend)
        await sem.set_limit(1)
        writes = WritesHeld(redis_server.url)
        try:
            await writes.hold()
            await _cancelled_while_taking(sem)  # (its take, then its release, held)
            await _closes_only_once_let_through(backend, writes.let_through)
        finally:
            await writes.aclose()
        assert (await sem.leases()).in_flight == 0
    finally:
        await redis.aclose()


# -- an aiohttp event stream's settle ----------------------------------------------------------


class Provider:
    """Streams a chunk, then, once ``finish`` is set, the usage event and the end."""

    def __init__(self) -> None:
        self.finish = asyncio.Event()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [], "usage": null}\n\n')
        await self.finish.wait()
        usage = {"choices": [], "usage": {"total_tokens": USED}}
        await response.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


@pytest.fixture
async def provider() -> AsyncIterator[tuple[TestServer, Provider]]:
    provider = Provider()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", provider.completions)
    async with TestServer(app, host="127.0.0.1") as server:
        yield server, provider


async def _stream_read(
    backend: Backend, server: TestServer, provider: Provider, before_end: Callable[[], Any]
) -> RateLimiter:
    """A metered call whose event stream the caller reads to its end (``before_end`` runs
    before the provider sends its usage); the token limiter, whose grant the usage settles."""
    requests = RateLimiter("llm-requests", backend)
    await requests.set_rate(RateType.OVERALL, 10, 60)
    tokens = RateLimiter("llm-tokens", backend)
    await tokens.set_rate(RateType.OVERALL, 1000, 60)
    middleware = RateLimitedClientMiddleware(requests, tokens=tokens)
    async with aiohttp.ClientSession(middlewares=[middleware]) as session:
        url = server.make_url("/v1/chat/completions")
        async with session.post(url, json=PROMPT) as response:
            assert response.content_type == "text/event-stream"
            await before_end()
            provider.finish.set()
            async for _ in response.content:
                pass
    return tokens


async def test_aclose_waits_for_an_aiohttp_stream_s_settle_on_memory(provider):
    server, events = provider
    backend = Held()

    async def nothing() -> None:
        pass

    tokens = await _stream_read(backend, server, events, nothing)

    async def let_through() -> None:
        backend.opened.set()

    await _closes_only_once_let_through(backend, let_through)
    assert await tokens.available_permits() == 1000 - USED


async def test_aclose_waits_for_an_aiohttp_stream_s_settle_on_redis(redis_server, provider):
    server, events = provider
    redis = Redis.from_url(redis_server.url)
    await redis.flushall()
    backend = RedisBackend(redis)
    writes = WritesHeld(redis_server.url)
    try:
        # (writes held once the call has its permits: the stream's settle alone is held)
        tokens = await _stream_read(backend, server, events, writes.hold)
        await _closes_only_once_let_through(backend, writes.let_through)
        assert await tokens.available_permits() == 1000 - USED
    finally:
        await writes.aclose()
        await redis.aclose()


# -- the contract: a rate store, a lease store, one context per store ---------------------------


class RatesOnly(Backend):
    """A third party's store of rates alone (it keeps no concurrency limiters)."""

    def __init__(self) -> None:
        super().__init__("rates-only")

    def with_client(self, client_id: str) -> Backend:
        raise NotImplementedError

    async def set_rate(self, *args: Any) -> bool:
        raise NotImplementedError

    async def get_config(self, name: str) -> Any:
        raise NotImplementedError

    async def try_acquire(self, *args: Any) -> Any:
        raise NotImplementedError

    async def wait_time(self, name: str, permits: int) -> int:
        raise NotImplementedError

    async def available_permits(self, name: str) -> int:
        raise NotImplementedError

    async def release(self, *args: Any) -> int:
        raise NotImplementedError

    async def block(self, name: str, duration_us: int | None) -> int:
        raise NotImplementedError

    async def delete(self, name: str) -> bool:
        raise NotImplementedError

    async def expire(self, name: str, ttl_us: int) -> bool:
        raise NotImplementedError

    async def clear_expire(self, name: str) -> bool:
        raise NotImplementedError


def test_a_concurrency_limiter_refuses_a_store_without_leases_when_it_is_made() -> None:
    store = RatesOnly()
    assert not isinstance(store, LeaseStore)
    with pytest.raises(InvalidArgumentError, match=r"RatesOnly keeps no leases.*LeaseStore"):
        ConcurrencyLimiter("model-server", store)
    RateLimiter("partner-api", store)  # (a store of rates serves rate limiters)
    assert isinstance(MemoryBackend(), LeaseStore)
    assert issubclass(RedisBackend, LeaseStore) and issubclass(RedisBackend, Backend)


def test_a_store_s_views_share_its_context() -> None:
    memory = MemoryBackend(client_id="service")
    redis = RedisBackend(Redis())  # (never connects)
    for store in (memory, redis):
        view = store.with_client("alice").with_client("bob")
        assert view.context is store.context
        assert view.client_id == "bob"
    assert memory.context is not MemoryBackend().context


def test_a_backend_s_breaker_policy_is_named_so_and_the_old_name_warns() -> None:
    policy = BreakerPolicy(first_backoff=2, max_backoff=3)
    backend = MemoryBackend(breaker=policy)
    assert backend.breaker_policy == policy
    assert backend.with_client("alice").breaker_policy == policy
    with pytest.warns(DeprecationWarning, match="breaker_policy"):
        assert backend.breaker == policy


# -- a store's helpers get values, not the store ------------------------------------------------

BACKENDS = Path(aiolimit.backends.__file__).parent
REDIS_PY_PRIVATE = {("redis/_wire.py", "_writer"), ("redis/_wire.py", "_parser")}
"""redis-py's own private state, read by the wire layer's fast path (kept or not by
measurement: issue 36, step 5)."""


def _private_reads(path: Path) -> set[tuple[str, str]]:
    """``x._name`` in ``path`` where ``x`` is not ``self``, ``cls`` or ``super()`` and no
    class of the module defines ``_name`` (a class may use its own on another instance)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    own = {node.name for node in ast.walk(tree) if isinstance(node, functions)}
    own |= {
        target.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute)
    }
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        value = node.value
        if node.attr.startswith("__") or node.attr in own or node.attr == "_replace":
            continue
        if isinstance(value, ast.Name) and value.id in ("self", "cls"):
            continue
        if isinstance(value, ast.Call) and ast.unparse(value.func) == "super":
            continue
        found.add((str(path.relative_to(BACKENDS)), node.attr))
    return found


def test_no_store_module_reads_another_object_s_private_attributes() -> None:
    found = set().union(*(_private_reads(path) for path in BACKENDS.rglob("*.py")))
    assert found <= REDIS_PY_PRIVATE
