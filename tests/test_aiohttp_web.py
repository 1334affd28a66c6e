"""The aiohttp.web middleware, through a real aiohttp server on 127.0.0.1 and ::1: the ASGI
middleware's statuses, header fields, keys, ``wait`` and failure policy."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import httpx
import pytest
from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from aiolimit import MemoryBackend, RateLimiter, RedisBackend
from aiolimit.aiohttp_web import RateLimitMiddleware
from aiolimit.asgi import RateLimitMiddleware as ASGIMiddleware
from aiolimit.asgi import Rule, client_ip, client_ip_from
from tools import LocalRedis, free_port


def has_ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


HOSTS = [
    "127.0.0.1",
    pytest.param("::1", marks=pytest.mark.skipif(not has_ipv6(), reason="no ::1")),
]


async def hello(request: aiohttp.web.Request) -> aiohttp.web.Response:
    return aiohttp.web.Response(text="hello")


async def missing(request: aiohttp.web.Request) -> aiohttp.web.Response:
    raise aiohttp.web.HTTPNotFound(text="no such item")


@asynccontextmanager
async def serving(
    limits: RateLimitMiddleware, host: str = "127.0.0.1", startup: bool = False
) -> AsyncIterator[str]:
    """A real aiohttp server with ``limits`` on ``host``; yields its base URL."""
    app = aiohttp.web.Application(middlewares=[limits])
    app.router.add_get("/api/items", hello)
    app.router.add_get("/api/missing", missing)
    app.router.add_post("/api/items", hello)
    if startup:
        app.on_startup.append(limits.on_startup)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, host, 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://{'[::1]' if ':' in host else host}:{port}"
    finally:
        await runner.cleanup()


async def get_all(
    url: str, count: int, method: str = "GET", headers: Sequence[dict[str, str]] = ()
) -> list[tuple[int, dict[str, str], bytes]]:
    """``count`` requests one after the other: status, headers (lower-case names), body."""
    answers = []
    async with aiohttp.ClientSession() as session:
        for i in range(count):
            sent = headers[i] if headers else {}
            async with session.request(method, url, headers=sent) as response:
                body = await response.read()
                named = {k.lower(): v for k, v in response.headers.items()}
                answers.append((response.status, named, body))
    return answers


FIELDS = ("ratelimit", "ratelimit-policy", "retry-after", "content-type")


def ours(headers: dict[str, str]) -> dict[str, str]:
    return {name: headers[name] for name in FIELDS if name in headers}


async def asgi_answers(rules: list[Rule], count: int) -> list[tuple[int, dict[str, str], bytes]]:
    async def asgi_hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hello")

    app = ASGIMiddleware(
        Starlette(routes=[Route("/api/items", asgi_hello)]), backend=MemoryBackend(), rules=rules
    )
    transport = httpx.ASGITransport(app, client=("127.0.0.1", 50000))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        answers = [await http.get("/api/items") for _ in range(count)]
    return [(a.status_code, dict(a.headers), a.content) for a in answers]


@pytest.mark.parametrize("host", HOSTS)
async def test_statuses_fields_and_body_are_the_asgi_middleware_s(host: str) -> None:
    def rules() -> list[Rule]:
        return [Rule("api", "3/minute"), Rule("api-per-client", "5/minute", key=client_ip)]

    limits = RateLimitMiddleware(backend=MemoryBackend(), rules=rules())
    async with serving(limits, host) as url:
        answers = await get_all(f"{url}/api/items", 4)
    expected = await asgi_answers(rules(), 4)
    assert [status for status, _, _ in answers] == [200, 200, 200, 429]
    for (status, headers, body), (asgi_status, asgi_headers, asgi_body) in zip(
        answers, expected, strict=True
    ):
        assert status == asgi_status
        assert ours(headers)["ratelimit"] == asgi_headers["ratelimit"]
        assert ours(headers)["ratelimit-policy"] == asgi_headers["ratelimit-policy"]
        assert body == asgi_body
    refused = answers[3][1]
    assert refused["retry-after"] == "60" == expected[3][1]["retry-after"]
    assert refused["content-type"].startswith("application/json")
    assert json.loads(answers[3][2])["detail"].startswith("Too Many Requests: rate limit 'api'")
    assert limits.stats.allowed == 3 and limits.stats.refused == 1


async def test_head_counts_as_get_and_its_429_has_the_fields_and_no_body() -> None:
    limits = RateLimitMiddleware(
        backend=MemoryBackend(), rules=[Rule("reads", "2/minute", methods=["GET"])]
    )
    async with serving(limits) as url:
        answers = await get_all(f"{url}/api/items", 3, method="HEAD")
        posted = await get_all(f"{url}/api/items", 1, method="POST")
    assert [status for status, _, _ in answers] == [200, 200, 429]
    assert all(body == b"" for _, _, body in answers)
    assert answers[2][1]["ratelimit"] == '"reads";r=0;t=60'
    assert answers[2][1]["retry-after"] == "60"
    assert posted[0][0] == 200 and "ratelimit" not in posted[0][1]  # not a rule of POST


async def test_a_handler_s_http_exception_carries_the_fields() -> None:
    limits = RateLimitMiddleware(backend=MemoryBackend(), rules=[Rule("api", "5/minute")])
    async with serving(limits) as url:
        (missing_item,) = await get_all(f"{url}/api/missing", 1)
        (no_route,) = await get_all(f"{url}/nowhere", 1)
    assert missing_item[0] == 404 and missing_item[2] == b"no such item"
    assert missing_item[1]["ratelimit"] == '"api";r=4;t=60'
    assert no_route[0] == 404 and no_route[1]["ratelimit"] == '"api";r=3;t=60'


JUNK = [
    "not-an-address",
    "203.0.113.9, ::::::, unknown",
    '"[2001:db8::1]:x", 999.1.1.1',
    "\t, , ,",
    "203.0.113." + "9" * 200,
]


async def test_hostile_forwarded_for_buys_no_new_budget() -> None:
    # The peer (127.0.0.1) is no trusted proxy: every header is ignored, one budget.
    limits = RateLimitMiddleware(
        backend=MemoryBackend(),
        rules=[
            Rule("by-peer", "3/minute", key=client_ip),
            Rule("by-proxy", "100/minute", key=client_ip_from(["10.0.0.0/8"])),
        ],
    )
    async with serving(limits) as url:
        headers = [{"X-Forwarded-For": junk} for junk in JUNK]
        answers = await get_all(f"{url}/api/items", len(JUNK), headers=headers)
    assert [status for status, _, _ in answers] == [200, 200, 200, 429, 429]
    assert limits.stats.refused == 2


async def test_a_trusted_proxy_s_forwarded_for_names_the_client() -> None:
    limits = RateLimitMiddleware(
        backend=MemoryBackend(),
        rules=[Rule("per-client", "1/minute", key=client_ip_from(["127.0.0.1"]))],
    )
    async with serving(limits) as url:
        sent = [
            {"X-Forwarded-For": "203.0.113.9"},
            {"X-Forwarded-For": "junk, 203.0.113.10"},  # what the client wrote is skipped
            {"X-Forwarded-For": "203.0.113.9"},
            {"X-Forwarded-For": ":::junk:::"},  # no address: the proxy (the peer) itself
            {"X-Forwarded-For": "also junk"},
        ]
        answers = await get_all(f"{url}/api/items", len(sent), headers=sent)
    assert [status for status, _, _ in answers] == [200, 200, 429, 200, 429]


async def test_wait_serves_a_burst_in_reserved_slots_without_a_429() -> None:
    limits = RateLimitMiddleware(
        backend=MemoryBackend(), rules=[Rule("burst", "4/0.2 seconds")], wait=1
    )
    async with serving(limits) as url, aiohttp.ClientSession() as session:
        loop = asyncio.get_running_loop()
        began = loop.time()

        async def one() -> int:
            async with session.get(f"{url}/api/items") as response:
                return response.status

        statuses = await asyncio.gather(*(one() for _ in range(8)))
        took = loop.time() - began
    assert statuses == [200] * 8
    assert took >= 0.2  # the second four waited for their window
    assert limits.stats.waited == 4 and limits.stats.refused == 0


def down_backend() -> tuple[Redis, RedisBackend]:
    redis = Redis.from_url(f"redis://127.0.0.1:{free_port()}")  # nothing listens there
    return redis, RedisBackend(redis, timeout=2)


@pytest.mark.parametrize(
    ("policy", "status"), [("deny", 503), ("allow", 200)], ids=["deny", "allow"]
)
async def test_a_down_store_answers_by_the_failure_policy(policy: Any, status: int) -> None:
    redis, backend = down_backend()
    limits = RateLimitMiddleware(
        backend=backend, rules=[Rule("api", "1/minute")], on_backend_error=policy,
        error_retry_after=7,
    )  # fmt: skip
    async with serving(limits) as url:
        answers = await get_all(f"{url}/api/items", 3)
    assert [s for s, _, _ in answers] == [status] * 3
    if policy == "deny":
        assert answers[0][1]["retry-after"] == "7"
        assert json.loads(answers[0][2])["detail"].startswith("Service Unavailable")
    else:
        assert answers[0][2] == b"hello" and "ratelimit" not in answers[0][1]
    assert limits.stats.backend_errors == 3 and limits.stats.outages == 1
    await backend.aclose()
    await redis.aclose()


async def test_on_redis_startup_writes_the_configs_and_requests_share_them(
    redis_server: LocalRedis,
) -> None:
    redis = Redis.from_url(redis_server.url)
    await redis.flushall()
    backend = RedisBackend(redis)
    limits = RateLimitMiddleware(backend=backend, rules=[Rule("aio-web", "2/minute")])
    async with serving(limits, startup=True) as url:
        stored = await RateLimiter("aio-web", backend).get_config()
        answers = await get_all(f"{url}/api/items", 3)
    assert stored is not None and stored.rate == 2
    assert [s for s, _, _ in answers] == [200, 200, 429]
    await backend.aclose()
    await redis.aclose()
