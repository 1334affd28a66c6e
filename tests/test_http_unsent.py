"""A request the HTTP clients could not even send (no connection: ``httpx.ConnectError``,
``aiohttp.ClientConnectorError``) hands back what it took, its permit and its estimated
tokens, exactly its own grants; one that failed after it was sent (a read timeout, the
server gone mid-answer) keeps them, as the partner may have counted it. httpx against a
MockTransport, aiohttp against a local server and a port nobody listens on, on every
backend (the limiters on a clock the test holds still)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from flavours import Flavour
from metering import AIOHTTP_ESTIMATE, ESTIMATE, PROMPT, Ticking, meters

from aiolimit import Acquired, ConcurrencyLimiter, RateLimiter
from aiolimit.aiohttp import RateLimitedClientMiddleware
from tools import free_port


def client(
    requests: RateLimiter, handle: Any, flavour: Flavour | None = None, **options: Any
) -> Any:
    flavour = flavour or Flavour.of("httpx")
    transport = flavour.transport(requests, flavour.httpx.MockTransport(handle), **options)
    return flavour.client(transport, base_url="http://llm.test")


async def test_httpx_a_request_that_could_not_connect_hands_back_its_permit_and_tokens(
    store: Any, flavour: Flavour
) -> None:
    requests, tokens = await meters(store, clock=Ticking())
    others: list[Acquired] = []
    ConnectError = flavour.httpx.ConnectError

    async def unreachable(request: Any) -> Any:
        # another caller is granted while this one is in flight: its grants are the newest
        others.append(await tokens.reserve(300))
        assert await requests.try_acquire()
        raise ConnectError("connection refused", request=request)

    async with client(requests, unreachable, flavour, tokens=tokens) as http:
        with pytest.raises(ConnectError):
            await http.post("/v1/chat/completions", json=PROMPT)
    assert await requests.available_permits() == 10 - 1  # the other caller's only
    assert await tokens.available_permits() == 1000 - 300
    # the other caller's grant is whole: it settles as it would have
    assert (await others[0].settle(50)).handed_back == 250
    assert await tokens.available_permits() == 1000 - 50


@pytest.mark.parametrize(
    ("failure", "sent"),
    [
        ("ConnectTimeout", False),
        ("PoolTimeout", False),
        ("ReadTimeout", True),
        ("RemoteProtocolError", True),
        ("ReadError", True),
    ],
)
async def test_httpx_a_failed_request_hands_back_only_what_never_left(
    store: Any, flavour: Flavour, failure: str, sent: bool
) -> None:
    requests, tokens = await meters(store)
    error = getattr(flavour.httpx, failure)

    def failing(request: Any) -> Any:
        raise error(failure)

    async with client(requests, failing, flavour, tokens=tokens) as http:
        with pytest.raises(error):
            await http.post("/v1/chat/completions", json=PROMPT)
    # sent: the partner may have counted it, the permit and the estimate stay spent
    assert await requests.available_permits() == (9 if sent else 10)
    assert await tokens.available_permits() == (1000 - ESTIMATE if sent else 1000)


async def test_httpx_without_tokens_a_request_that_could_not_connect_hands_back_its_permit(
    store: Any,
) -> None:
    requests, _ = await meters(store)

    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with client(requests, unreachable) as http:
        for _ in range(3):
            with pytest.raises(httpx.ConnectError):
                await http.get("/")
    assert await requests.available_permits() == 10


# -- aiohttp ------------------------------------------------------------------------------------


@pytest.fixture
async def hangs_up() -> AsyncIterator[TestServer]:
    """A server that reads the request, then closes the connection without an answer."""

    async def hang_up(request: web.Request) -> web.Response:
        await request.read()
        assert request.transport is not None
        request.transport.close()
        await asyncio.sleep(0)
        return web.Response()

    app = web.Application()
    app.router.add_post("/v1/plain", hang_up)
    async with TestServer(app, host="127.0.0.1") as server:
        yield server


async def test_aiohttp_a_request_that_could_not_connect_hands_back_its_permit_and_tokens(
    store: Any,
) -> None:
    requests, tokens = await meters(store)
    middleware = RateLimitedClientMiddleware(requests, tokens=tokens)
    nobody = f"http://127.0.0.1:{free_port()}/v1/plain"
    async with aiohttp.ClientSession(middlewares=[middleware]) as session:
        with pytest.raises(aiohttp.ClientConnectorError):
            await session.post(nobody, json=PROMPT)
    assert await requests.available_permits() == 10
    assert await tokens.available_permits() == 1000


async def test_aiohttp_a_request_the_server_hung_up_on_keeps_its_permit_and_tokens(
    store: Any, hangs_up: TestServer
) -> None:
    requests, tokens = await meters(store)
    middleware = RateLimitedClientMiddleware(requests, tokens=tokens)
    async with aiohttp.ClientSession(middlewares=[middleware]) as session:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await session.post(hangs_up.make_url("/v1/plain"), json=PROMPT)
    assert await requests.available_permits() == 9
    assert await tokens.available_permits() == 1000 - AIOHTTP_ESTIMATE


async def test_with_a_slot_a_request_that_could_not_connect_hands_back_slot_and_permit(
    store: Any,
) -> None:
    requests, _ = await meters(store)
    slots = ConcurrencyLimiter("partner-slots", requests.backend)
    await slots.set_limit(1, lease=30)

    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with client(requests, unreachable, concurrency=slots) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get("/")
    assert await requests.available_permits() == 10
    lease = await slots.try_lease(timeout=0)  # the one slot is free again
    assert lease is not None
    await lease.release()
