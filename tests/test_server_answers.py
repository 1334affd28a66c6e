"""The three server surfaces answer a refusal alike: the ASGI middleware (uvicorn), the
aiohttp.web middleware (aiohttp's server) and the FastAPI dependency (uvicorn) give a rate
refused, a slot refused and a store down (``"deny"``) the same status, header fields and
body, byte for byte; a HEAD answer has the fields and no body."""

from __future__ import annotations

import asyncio
import json
import types
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from conformance import until
from redis.asyncio import Redis
from surfaces import SURFACES, Handler, serving

from aiolimit import ConcurrencyLimiter, MemoryBackend, RedisBackend
from aiolimit.asgi import RateLimitMiddleware, Rule, client_ip
from aiolimit.asgi import _fields as fields_module
from tools import free_port

# What a server adds to every answer of its own accord: not the surface's to say.
SERVERS_OWN = {b"date", b"server"}

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


def answer_of(response: httpx.Response) -> Answer:
    headers = sorted(
        (name.lower(), value)
        for name, value in response.headers.raw
        if name.lower() not in SERVERS_OWN
    )
    return response.status_code, headers, response.content


@pytest.fixture(autouse=True)
def fixed_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """``X-RateLimit-Reset`` is Unix time: one second for every surface's answers."""
    monkeypatch.setattr(fields_module, "time", types.SimpleNamespace(time=lambda: 1.7e9))


def work_rule() -> Rule:
    return Rule("work", "1/minute", key=client_ip)


async def rate_refused(surface: str) -> list[Answer]:
    options = {"backend": MemoryBackend(), "legacy_headers": True}
    async with (
        serving(surface, Handler(), rule=work_rule(), **options) as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        served = await http.get("/work")
        assert served.status_code == 200, served.text
        return [answer_of(await http.get("/work")), answer_of(await http.head("/work"))]


async def slot_refused(surface: str) -> list[Answer]:
    backend = MemoryBackend()
    slots = ConcurrencyLimiter("work-in-flight", backend, limit=1)
    handler = Handler("hold")
    options = {"backend": backend, "legacy_headers": True, "concurrency": slots}
    async with (
        serving(surface, handler, rule=work_rule(), **options) as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        held = asyncio.ensure_future(http.get("/work"))
        await until(handler.count_in_flight, bool, "the first served")
        answers = [answer_of(await http.get("/work")), answer_of(await http.head("/work"))]
        handler.release.set()
        assert (await held).status_code == 200
    return answers


async def store_down(surface: str) -> list[Answer]:
    async with down_backend() as backend:
        options = {"backend": backend, "legacy_headers": True, "error_retry_after": 7}
        async with (
            serving(surface, Handler(), rule=work_rule(), **options) as url,
            httpx.AsyncClient(base_url=url) as http,
        ):
            return [answer_of(await http.get("/work")), answer_of(await http.head("/work"))]


@asynccontextmanager
async def down_backend() -> AsyncIterator[RedisBackend]:
    redis = Redis.from_url(f"redis://127.0.0.1:{free_port()}")  # nothing listens there
    backend = RedisBackend(redis, timeout=2)
    try:
        yield backend
    finally:
        await backend.aclose()
        await redis.aclose()


CASES: dict[str, tuple[Callable[[str], Any], int, str]] = {
    "rate-refused": (rate_refused, 429, "Too Many Requests: rate limit 'work' exceeded"),
    "slot-refused": (slot_refused, 503, "Service Unavailable: 'work-in-flight' has too many"),
    "store-down": (store_down, 503, "Service Unavailable: rate limits cannot be checked"),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_every_surface_answers_a_refusal_byte_for_byte_alike(case: str) -> None:
    run, status, detail = CASES[case]
    answers = {surface: await run(surface) for surface in SURFACES}
    for surface in SURFACES[1:]:
        assert answers[surface] == answers[SURFACES[0]], surface
    (get_status, get_headers, body), (head_status, head_headers, head_body) = answers["asgi"]
    assert get_status == head_status == status
    assert json.loads(body)["detail"].startswith(detail)
    assert head_body == b""
    assert head_headers == get_headers  # content-length included: a GET's, as RFC 9110 asks
    named = dict(get_headers)
    assert named[b"content-type"] == b"application/json"
    assert named[b"content-length"] == str(len(body)).encode()
    assert (
        named[b"retry-after"] == {429: b"60", 503: b"1" if case == "slot-refused" else b"7"}[status]
    )
    if case == "rate-refused":
        assert named[b"ratelimit"] == b'"work";r=0;t=60'
        assert named[b"x-ratelimit-reset"] == str(int(1.7e9) + 60).encode()


async def test_a_head_refusal_sends_no_body_from_the_asgi_middleware_itself() -> None:
    """Without a server that drops it: the middleware's own messages."""

    async def ok(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    app = RateLimitMiddleware(ok, backend=MemoryBackend(), rules=[Rule("r", "1/minute")])
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    for method in ("GET", "GET", "HEAD"):
        sent.clear()
        scope = {"type": "http", "method": method, "path": "/", "headers": [], "root_path": ""}
        await app(scope, receive, send)
    start, body = sent
    assert start["status"] == 429
    assert body == {"type": "http.response.body", "body": b""}
    length = dict(start["headers"])[b"content-length"]
    assert int(length) > 0  # the GET answer's length
