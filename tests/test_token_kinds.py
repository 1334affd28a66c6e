"""Anthropic's separate input and output token limits (``tokens={"input": itpm, "output":
otpm}``): a request's input tokens (estimated from its body) and its ``max_tokens`` (of the
output limiter) taken with its permit, all or nothing; each limiter settled by its own usage
field (``input_tokens``, ``output_tokens``) and capped by its own headers
(``anthropic-ratelimit-input-tokens-*``, ``-output-tokens-*``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from typing import Any

import aiohttp
import httpx2
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from anthropic_api import MessagesAPI
from conformance import ManualClock, new_client
from flavours import Flavour
from metering import Ticking

from aiolimit import Backend, InvalidArgumentError, MemoryBackend, RateLimited, RateLimiter
from aiolimit._meter import estimate_by_kind, usage_by_kind
from aiolimit.aiohttp import RateLimitedClientMiddleware
from aiolimit.httpx2 import RateLimitedTransport

MESSAGE = {
    "model": "small",
    "max_tokens": 200,
    "messages": [{"role": "user", "content": "why? " * 40}],  # 200 characters
}
BODY = json.dumps(MESSAGE, separators=(",", ":")).encode()  # as httpx writes it
INPUT_ESTIMATE = len(BODY) // 4 + 1


async def kinds(backend: Backend) -> tuple[RateLimiter, RateLimiter, RateLimiter]:
    """10 requests, 1000 input and 1000 output tokens a minute."""
    requests = RateLimiter("llm-requests", backend, rate="10/minute")
    input_tokens = RateLimiter("llm-input-tokens", backend, rate="1000/minute")
    output_tokens = RateLimiter("llm-output-tokens", backend, rate="1000/minute")
    return requests, input_tokens, output_tokens


def on(store: Any) -> Backend:
    """Another client of the store, on a clock the test holds still."""
    return new_client(store, clock=ManualClock())


def memory(clock: ManualClock | None = None) -> Backend:
    return MemoryBackend(clock=clock or ManualClock())


def client(requests: RateLimiter, handle: Any, flavour: Flavour, **options: Any) -> Any:
    transport = flavour.transport(requests, flavour.httpx.MockTransport(handle), **options)
    return flavour.client(transport, base_url="https://llm.example")


def answering(flavour: Flavour, usage: dict[str, int], **headers: str) -> Any:
    def handle(request: Any) -> Any:
        return flavour.httpx.Response(200, json={"usage": usage}, headers=headers)

    return handle


async def test_each_limiter_is_settled_by_its_own_usage_field(store: Any, flavour: Flavour) -> None:
    requests, input_tokens, output_tokens = await kinds(on(store))
    usage = {"input_tokens": 40, "cache_creation_input_tokens": 10, "output_tokens": 75}
    split = {"input": input_tokens, "output": output_tokens}
    async with client(requests, answering(flavour, usage), flavour, tokens=split) as http:
        response = await http.post("/v1/messages", json=MESSAGE)
    assert response.json() == {"usage": usage}
    assert await requests.available_permits() == 9
    # input: what Anthropic counts against it (cache writes too, not cache reads)
    assert await input_tokens.available_permits() == 1000 - 50
    assert await output_tokens.available_permits() == 1000 - 75


async def test_the_estimates_stand_until_the_body_is_read_then_each_settles(
    flavour: Flavour,
) -> None:
    requests, input_tokens, output_tokens = await kinds(memory())
    events = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 30, "output_tokens": 1}}},
        {"type": "content_block_delta", "delta": {"text": "fine"}},
        {"type": "message_delta", "usage": {"output_tokens": 60}},
        {"type": "message_stop"},
    ]
    stream = b"".join(f"event: x\ndata: {json.dumps(e)}\n\n".encode() for e in events)

    async def chunks() -> AsyncIterator[bytes]:
        for line in stream.splitlines(keepends=True):
            yield line

    def handle(request: Any) -> Any:
        sse = {"content-type": "text/event-stream"}
        return flavour.httpx.Response(200, content=chunks(), headers=sse)

    split = {"input": input_tokens, "output": output_tokens}
    async with (
        client(requests, handle, flavour, tokens=split) as http,
        http.stream("POST", "/v1/messages", json=MESSAGE) as response,
    ):
        assert await input_tokens.available_permits() == 1000 - INPUT_ESTIMATE
        assert await output_tokens.available_permits() == 1000 - 200  # max_tokens
        async for _ in response.aiter_lines():
            pass
    assert await input_tokens.available_permits() == 1000 - 30
    assert await output_tokens.available_permits() == 1000 - 60


async def test_each_limiter_is_capped_by_its_own_headers(store: Any) -> None:
    requests, input_tokens, output_tokens = await kinds(on(store))
    reset = (datetime.now(timezone.utc) + timedelta(seconds=30)).isoformat()
    headers = {
        "anthropic-ratelimit-input-tokens-remaining": "300",
        "anthropic-ratelimit-input-tokens-reset": reset,
        "anthropic-ratelimit-output-tokens-remaining": "80",
        "anthropic-ratelimit-output-tokens-reset": reset,
        "anthropic-ratelimit-tokens-remaining": "5",  # (the tighter of the two: no limiter's)
        "anthropic-ratelimit-tokens-reset": reset,
    }
    usage = {"input_tokens": 40, "output_tokens": 75}
    handle = answering(Flavour.of("httpx2"), usage, **headers)
    split = {"input": input_tokens, "output": output_tokens}
    async with client(requests, handle, Flavour.of("httpx2"), tokens=split) as http:
        await http.post("/v1/messages", json=MESSAGE)
    assert await input_tokens.available_permits() == 300
    assert await output_tokens.available_permits() == 80


async def test_one_kind_alone_meters_that_kind_only() -> None:
    requests, _, output_tokens = await kinds(memory())
    handle = answering(Flavour.of("httpx2"), {"input_tokens": 40, "output_tokens": 75})
    split = {"output": output_tokens}
    async with client(requests, handle, Flavour.of("httpx2"), tokens=split) as http:
        await http.post("/v1/messages", json=MESSAGE)
    assert await output_tokens.available_permits() == 1000 - 75


async def test_the_permit_and_both_kinds_are_taken_all_or_nothing() -> None:
    requests, input_tokens, output_tokens = await kinds(memory())
    assert await output_tokens.try_acquire(1000 - 150)  # too few left for max_tokens 200
    seen: list[Any] = []
    split = {"input": input_tokens, "output": output_tokens}
    async with client(requests, seen.append, Flavour.of("httpx2"), tokens=split, timeout=0) as http:
        with pytest.raises(RateLimited):
            await http.post("/v1/messages", json=MESSAGE)
    assert seen == []
    assert await requests.available_permits() == 10
    assert await input_tokens.available_permits() == 1000


async def test_a_refused_or_unsent_call_hands_back_both_kinds() -> None:
    requests, input_tokens, output_tokens = await kinds(memory(Ticking()))
    answers = [
        httpx2.Response(429, headers={"retry-after": "0"}, json={"type": "error"}),
        httpx2.ConnectError("connection refused"),
    ]

    def handle(request: Any) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    split = {"input": input_tokens, "output": output_tokens}
    async with client(requests, handle, Flavour.of("httpx2"), tokens=split) as http:
        with pytest.raises(httpx2.ConnectError):  # refused, retried: could not connect
            await http.post("/v1/messages", json=MESSAGE)
    assert await requests.available_permits() == 9  # the refused call's: the partner saw it
    assert await input_tokens.available_permits() == 1000
    assert await output_tokens.available_permits() == 1000


async def test_an_estimate_and_a_usage_of_ones_own_give_a_count_per_kind() -> None:
    requests, input_tokens, output_tokens = await kinds(memory())
    handle = answering(Flavour.of("httpx2"), {"in": 7, "out": 9})
    async with client(
        requests,
        handle,
        Flavour.of("httpx2"),
        tokens={"input": input_tokens, "output": output_tokens},
        estimate=lambda request: {"input": 100, "output": 50},
        usage=lambda response: {
            "input": response.json()["usage"]["in"],
            "output": response.json()["usage"]["out"],
        },
    ) as http:
        await http.post("/v1/messages", json=MESSAGE)
    assert await input_tokens.available_permits() == 1000 - 7
    assert await output_tokens.available_permits() == 1000 - 9


async def test_token_kinds_that_cannot_be_metered_are_refused() -> None:
    requests, input_tokens, output_tokens = await kinds(memory())
    for wrong in (
        {},
        {"prompt": input_tokens},
        {"input": input_tokens, "output": input_tokens},
        {"input": requests},
        {"input": "itpm"},
    ):
        with pytest.raises(InvalidArgumentError):
            RateLimitedTransport(requests, tokens=wrong)  # type: ignore[arg-type]
    handle = answering(Flavour.of("httpx2"), {})
    split = {"input": input_tokens, "output": output_tokens}
    for estimate in (lambda request: 5, lambda request: {"input": -1, "output": 5}):
        async with client(
            requests, handle, Flavour.of("httpx2"), tokens=split, estimate=estimate
        ) as http:
            with pytest.raises(InvalidArgumentError, match="estimate"):
                await http.post("/v1/messages", json=MESSAGE)
    assert await requests.available_permits() == 10


def test_the_default_estimate_and_usage_read_anthropics_and_openais_fields() -> None:
    assert estimate_by_kind(BODY) == {"input": INPUT_ESTIMATE, "output": 200}
    assert estimate_by_kind(b"not json") == {"input": 3, "output": 0}
    assert usage_by_kind(b'{"usage": {"input_tokens": 5, "output_tokens": 6}}') == {
        "input": 5,
        "output": 6,
    }
    openai = b'{"usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}}'
    assert usage_by_kind(openai) == {"input": 5, "output": 6}
    cached = b'{"usage": {"input_tokens": 5, "cache_read_input_tokens": 900, "output_tokens": 6}}'
    assert usage_by_kind(cached) == {"input": 5, "output": 6}  # cache reads: not counted
    assert usage_by_kind(b'{"id": 1}') is None
    assert usage_by_kind(b"") is None


# -- a provider that keeps the two quotas apart ----------------------------------------------


@pytest.mark.looptime
@pytest.mark.parametrize("states", [True, False], ids=["headers", "no-headers"])
async def test_many_callers_keep_to_both_quotas_without_a_429(states: bool) -> None:
    api = MessagesAPI(httpx2, input_quota=3000, output_quota=1500, window=60.0, latency=2.0)
    api.states = states
    backend = MemoryBackend()
    requests = RateLimiter("anthropic-rpm", backend, rate="100/minute")
    input_tokens = RateLimiter("anthropic-itpm", backend, rate="3000/minute")
    output_tokens = RateLimiter("anthropic-otpm", backend, rate="1500/minute")
    split = {"input": input_tokens, "output": output_tokens}
    transport = RateLimitedTransport(requests, httpx2.MockTransport(api.handle), tokens=split)
    async with httpx2.AsyncClient(transport=transport, base_url="https://llm.example") as http:

        async def ask(i: int) -> int:
            message = {**MESSAGE, "messages": [{"role": "user", "content": f"{i}: " + "x" * 400}]}
            return (await http.post("/v1/messages", json=message)).status_code

        statuses = await asyncio.gather(*(ask(i) for i in range(60)))
    assert api.refused == 0 and statuses == [200] * 60
    assert len(api.arrivals) == 60
    if not states:  # the settles alone: each call's unwritten output back for the next
        first_minute = [at for at in api.arrivals if at < api.arrivals[0] + 60_000_000]
        assert len(first_minute) > 1500 // 200 * 2


@pytest.fixture
async def anthropic_server() -> AsyncIterator[TestServer]:
    reset = (datetime.now(timezone.utc) + timedelta(seconds=30)).isoformat()
    headers = {
        "anthropic-ratelimit-input-tokens-remaining": "500",
        "anthropic-ratelimit-input-tokens-reset": reset,
        "anthropic-ratelimit-output-tokens-remaining": "600",
        "anthropic-ratelimit-output-tokens-reset": reset,
    }

    async def messages(request: web.Request) -> web.StreamResponse:
        await request.json()
        if request.query.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            start = {"message": {"usage": {"input_tokens": 30, "output_tokens": 1}}}
            await response.write(f"data: {json.dumps(start)}\n\n".encode())
            await response.write(b'data: {"usage": {"output_tokens": 60}}\n\n')
            await response.write_eof()
            return response
        usage = {"input_tokens": 12, "output_tokens": 20}
        return web.json_response({"usage": usage}, headers=headers)

    app = web.Application()
    app.router.add_post("/v1/messages", messages)
    async with TestServer(app, host="127.0.0.1") as server:
        yield server


async def test_aiohttp_meters_the_two_kinds_too(anthropic_server: TestServer) -> None:
    requests, input_tokens, output_tokens = await kinds(memory())
    split = {"input": input_tokens, "output": output_tokens}
    middleware = RateLimitedClientMiddleware(requests, tokens=split)
    async with aiohttp.ClientSession(middlewares=[middleware]) as session:
        async with session.post(anthropic_server.make_url("/v1/messages"), json=MESSAGE) as got:
            assert (await got.json())["usage"]["output_tokens"] == 20
        assert await input_tokens.available_permits() == 500  # capped after the settle
        assert await output_tokens.available_permits() == 600
        url = anthropic_server.make_url("/v1/messages?stream=1")
        async with session.post(url, json=MESSAGE) as got:
            await got.read()
    await asyncio.sleep(0.05)  # (the stream's settle runs as a task of its own)
    assert await input_tokens.available_permits() == 500 - 30
    assert await output_tokens.available_permits() == 600 - 60


async def test_a_usage_that_is_not_a_count_per_kind_is_logged_and_the_estimates_stand(
    caplog: pytest.LogCaptureFixture,
) -> None:
    requests, input_tokens, output_tokens = await kinds(memory())
    handle = answering(Flavour.of("httpx2"), {"input_tokens": 40, "output_tokens": 75})
    split = {"input": input_tokens, "output": output_tokens}
    async with client(
        requests, handle, Flavour.of("httpx2"), tokens=split, usage=lambda response: 115
    ) as http:
        await http.post("/v1/messages", json=MESSAGE)
    assert await input_tokens.available_permits() == 1000 - INPUT_ESTIMATE
    assert await output_tokens.available_permits() == 1000 - 200
    assert "usage() must give a count per kind (input, output), not 115" in caplog.text
