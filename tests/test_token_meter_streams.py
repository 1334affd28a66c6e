"""The aiohttp client middleware's token meter on event streams: a ``text/event-stream`` body
is settled by the usage of its last ``data:`` event that carries one, once the caller has
read it and the response is released; a stream left before its usage event keeps the
estimate. A real aiohttp server on 127.0.0.1, on every backend."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from conformance import until
from metering import AIOHTTP_ESTIMATE, PROMPT, meters

from aiolimit import RateLimiter
from aiolimit._meter import MAX_BODY, UsageTail
from aiolimit.aiohttp import RateLimitedClientMiddleware

USED = 42


def event(document: object) -> bytes:
    return b"data: " + json.dumps(document).encode() + b"\n\n"


# An OpenAI stream with usage: every chunk says "usage": null, the last one before [DONE]
# says what the call used.
CHUNKS = [event({"choices": [{"delta": {"content": word}}], "usage": None}) for word in "abc"]
FINAL = [event({"choices": [], "usage": {"total_tokens": USED}}), b"data: [DONE]\n\n"]


class Provider:
    """Streams ``CHUNKS``, then, once ``finish`` is set, ``FINAL``."""

    def __init__(self) -> None:
        self.finish = asyncio.Event()
        self.finish.set()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in CHUNKS:
            await response.write(chunk)
        await self.finish.wait()
        for chunk in FINAL:
            await response.write(chunk)
        await response.write_eof()
        return response


@pytest.fixture
async def provider() -> AsyncIterator[tuple[TestServer, Provider]]:
    provider = Provider()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", provider.completions)
    async with TestServer(app, host="127.0.0.1") as server:
        yield server, provider


async def left(tokens: RateLimiter, expected: int) -> None:
    await until(tokens.available_permits, lambda n: n == expected, f"{expected} tokens left")


async def test_aiohttp_settles_an_event_stream_by_its_last_usage_once_released(
    store: Any, provider: tuple[TestServer, Provider]
) -> None:
    server, _ = provider
    requests, tokens = await meters(store)
    middleware = RateLimitedClientMiddleware(requests, tokens=tokens)
    async with aiohttp.ClientSession(middlewares=[middleware]) as session:
        url = server.make_url("/v1/chat/completions")
        async with session.post(url, json=PROMPT) as response:
            assert response.content_type == "text/event-stream"
            assert await tokens.available_permits() == 1000 - AIOHTTP_ESTIMATE
            lines = [line async for line in response.content if line.strip()]
            assert lines[-1] == b"data: [DONE]\n"
        await left(tokens, 1000 - USED)
        # Read in chunks of any size, the same.
        async with session.post(url, json=PROMPT) as response:
            async for _ in response.content.iter_chunked(7):
                pass
        await left(tokens, 1000 - 2 * USED)


async def test_aiohttp_leaves_the_estimate_of_a_stream_left_before_its_usage(
    store: Any, provider: tuple[TestServer, Provider]
) -> None:
    server, streaming = provider
    streaming.finish.clear()  # the usage event never comes while the caller reads
    requests, tokens = await meters(store)
    middleware = RateLimitedClientMiddleware(requests, tokens=tokens)
    async with aiohttp.ClientSession(middlewares=[middleware]) as session:
        url = server.make_url("/v1/chat/completions")
        async with session.post(url, json=PROMPT) as response:
            first = await response.content.readline()
            assert b'"usage": null' in first
        streaming.finish.set()
        assert await tokens.available_permits() == 1000 - AIOHTTP_ESTIMATE
        # A complete stream after it settles as usual: the meter did not stop.
        async with session.post(url, json=PROMPT) as response:
            await response.read()
        await left(tokens, 1000 - AIOHTTP_ESTIMATE - USED)


def test_a_usage_tail_reads_events_split_anywhere_and_skips_overlong_lines() -> None:
    stream = b"".join([*CHUNKS, b"data: " + b"x" * (MAX_BODY + 10) + b"\n\n", *FINAL])
    for size in (1, 7, 4096, len(stream)):
        tail = UsageTail()
        for at in range(0, len(stream), size):
            tail.feed(stream[at : at + size])
        assert tail.finish() == USED
    tail = UsageTail()
    tail.feed(b'data: {"usage": {"total_tokens": 5}}\n\ndata: {"usage": {"total_tokens": 9}}')
    assert tail.finish() == 9  # the last event, even without its line end
    tail = UsageTail()
    tail.feed(b"data: " + b"x" * MAX_BODY + b'{"usage": {"total_tokens": 5}}\n')
    assert tail.finish() is None  # a line past MAX_BODY is not read
