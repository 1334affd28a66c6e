"""One transport for httpx and httpx2 (the successor the LLM SDKs use, the same API under
another module name): whichever module a transport is imported from, it serves a client of
either flavour by the request's own classes (its retry, its unsent errors, its metered and
held bodies), and makes its default inner transport of the first request's flavour."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from flavours import FLAVOURS, Flavour
from metering import ESTIMATE, PROMPT, Ticking

import aiolimit.httpx
import aiolimit.httpx2
from aiolimit import MemoryBackend, RateLimiter

CROSSED = [
    pytest.param(transport, client, id=f"{transport}-in-{client}")
    for transport in FLAVOURS
    for client in FLAVOURS
]
"""Every transport (by the module it is imported from) in a client of every flavour."""


def test_each_transport_is_its_own_modules_transport() -> None:
    assert isinstance(aiolimit.httpx.RateLimitedTransport(_limiter()), httpx.AsyncBaseTransport)
    assert isinstance(aiolimit.httpx2.RateLimitedTransport(_limiter()), httpx2.AsyncBaseTransport)


@pytest.mark.looptime
@pytest.mark.parametrize(("transport", "client"), CROSSED)
async def test_a_transport_retries_a_429_and_meters_in_a_client_of_either_flavour(
    transport: str, client: str
) -> None:
    requests, tokens = await _meters()
    http = Flavour.of(client).httpx
    events = b'data: {"usage": {"total_tokens": 42}}\n\ndata: [DONE]\n\n'
    answers = [
        http.Response(429, json={"error": "slow down"}, headers={"retry-after": "0"}),
        http.Response(200, content=_chunks(events)),  # streamed: metered as it is read
    ]
    arrivals: list[Any] = []

    def provider(request: Any) -> Any:
        arrivals.append(request)
        return answers.pop(0)

    limited = Flavour.of(transport).transport(requests, http.MockTransport(provider), tokens=tokens)
    async with (
        http.AsyncClient(transport=limited, base_url="http://llm.test") as session,
        session.stream("POST", "/v1/chat/completions", json=PROMPT) as response,
    ):
        assert response.status_code == 200  # the retry, after the pause
        assert await tokens.available_permits() == 1000 - ESTIMATE  # the refused one's back
        await response.aread()
    assert len(arrivals) == 2
    assert await requests.available_permits() == 10 - 2  # a permit per arrival
    assert await tokens.available_permits() == 1000 - 42


@pytest.mark.looptime
@pytest.mark.parametrize(("transport", "client"), CROSSED)
async def test_a_request_that_never_left_hands_back_its_permit_in_either_flavour(
    transport: str, client: str
) -> None:
    requests, tokens = await _meters()
    http = Flavour.of(client).httpx

    def unreachable(request: Any) -> Any:
        raise http.ConnectError("connection refused", request=request)

    limited = Flavour.of(transport).transport(
        requests, http.MockTransport(unreachable), tokens=tokens
    )
    async with http.AsyncClient(transport=limited, base_url="http://llm.test") as session:
        with pytest.raises(http.ConnectError):
            await session.post("/v1/chat/completions", json=PROMPT)
    assert await requests.available_permits() == 10
    assert await tokens.available_permits() == 1000


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"hello": "world"})

    app = web.Application()
    app.router.add_get("/", hello)
    async with TestServer(app, host="127.0.0.1") as served:
        yield served


@pytest.mark.parametrize(("transport", "client"), CROSSED)
async def test_the_default_inner_transport_is_of_the_first_requests_flavour(
    server: TestServer, transport: str, client: str
) -> None:
    http = Flavour.of(client).httpx
    limiter = _limiter()
    async with http.AsyncClient(transport=Flavour.of(transport).transport(limiter)) as session:
        response = await session.get(str(server.make_url("/")))
    assert isinstance(response, http.Response)
    assert response.json() == {"hello": "world"}
    assert await limiter.available_permits() == 9


async def test_a_request_of_neither_flavour_is_refused_with_a_type_error() -> None:
    transport = aiolimit.httpx2.RateLimitedTransport(_limiter(), httpx2.MockTransport(print))
    with pytest.raises(TypeError, match="httpx or httpx2 requests"):
        await transport.handle_async_request(object())


def _limiter() -> RateLimiter:
    return RateLimiter("partner", MemoryBackend(), rate="10/minute")


async def _meters() -> tuple[RateLimiter, RateLimiter]:
    """10 requests and 1000 tokens a minute, on a clock one microsecond further at every
    reading (a grant never shares its instant with the one it follows)."""
    backend = MemoryBackend(clock=Ticking())
    requests = RateLimiter("llm-requests", backend, rate="10/minute")
    tokens = RateLimiter("llm-tokens", backend, rate="1000/minute")
    return requests, tokens


async def _chunks(events: bytes) -> AsyncIterator[bytes]:
    for event in events.split(b"\n\n"):
        yield event + b"\n\n"
