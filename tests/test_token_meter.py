"""The HTTP clients' token meter (``tokens=``, ``estimate=``, ``usage=``): a request's
estimated tokens taken with its permit, all or nothing; settled by the usage its response
reports once read (a streamed body: once closed); a provider's rate-limit headers taken as
floors. httpx against a MockTransport, aiohttp against a local aiohttp server, on every
backend (the limiters on a clock the test holds still)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from flavours import Flavour
from metering import AIOHTTP_ESTIMATE, ESTIMATE, PROMPT, Ticking, meters

from aiolimit import (
    InvalidArgumentError,
    RateLimited,
    RateLimiter,
    ShardedRateLimiter,
)
from aiolimit._meter import CAP_EVERY
from aiolimit.aiohttp import RateLimitedClientMiddleware
from aiolimit.httpx import RateLimitedTransport


def provider(answers: list[Any], seen: list[Any]) -> Callable[[Any], Any]:
    def handle(request: Any) -> Any:
        seen.append(request)
        return answers.pop(0)

    return handle


async def chunks(events: bytes) -> AsyncIterator[bytes]:
    """A body sent in chunks, as a provider streams one (not read before it is iterated)."""
    for event in events.split(b"\n\n"):
        yield event + b"\n\n"


def client(
    requests: RateLimiter, handle: Any, flavour: Flavour | None = None, **options: Any
) -> Any:
    flavour = flavour or Flavour.of("httpx")
    transport = flavour.transport(requests, flavour.httpx.MockTransport(handle), **options)
    return flavour.client(transport, base_url="http://llm.test")


async def test_httpx_settles_the_estimate_by_the_usage_the_response_reports(
    store: Any, flavour: Flavour
) -> None:
    requests, tokens = await meters(store)
    seen: list[Any] = []
    answers = [flavour.httpx.Response(200, json={"usage": {"total_tokens": 30}})]
    async with client(requests, provider(answers, seen), flavour, tokens=tokens) as http:
        response = await http.post("/v1/chat/completions", json=PROMPT)
    assert response.json() == {"usage": {"total_tokens": 30}}
    assert await tokens.available_permits() == 1000 - 30
    assert await requests.available_permits() == 9


async def test_httpx_holds_a_streamed_bodys_estimate_until_it_is_closed(
    store: Any, flavour: Flavour
) -> None:
    requests, tokens = await meters(store)
    events = b'data: {"choices": []}\n\ndata: {"usage": {"total_tokens": 42}}\n\ndata: [DONE]'
    sse = {"content-type": "text/event-stream"}
    answers = [flavour.httpx.Response(200, content=chunks(events), headers=sse)]
    async with client(requests, provider(answers, []), flavour, tokens=tokens) as http:
        async with http.stream("POST", "/v1/chat/completions", json=PROMPT) as response:
            assert await tokens.available_permits() == 1000 - ESTIMATE
            async for _ in response.aiter_lines():
                pass
        assert await tokens.available_permits() == 1000 - 42


async def test_httpx_without_usage_leaves_the_estimate_standing(store: Any) -> None:
    requests, tokens = await meters(store)
    answers = [httpx.Response(200, json={"id": 1}), httpx.Response(200, text="not json")]
    async with client(requests, provider(answers, []), tokens=tokens) as http:
        await http.post("/a", json=PROMPT)
        await http.post("/b", json=PROMPT)
    assert await tokens.available_permits() == 1000 - 2 * ESTIMATE


async def test_httpx_takes_the_permit_and_the_tokens_all_or_nothing(
    store: Any, flavour: Flavour
) -> None:
    requests, tokens = await meters(store, tokens=ESTIMATE + 50)
    seen: list[Any] = []
    answers = [flavour.httpx.Response(200, json={"id": 1})]
    async with client(requests, provider(answers, seen), flavour, tokens=tokens, timeout=0) as http:
        await http.post("/a", json=PROMPT)  # no usage: the estimate stands
        with pytest.raises(RateLimited):
            await http.post("/b", json=PROMPT)  # the tokens refuse: no permit taken either
    assert len(seen) == 1
    assert await requests.available_permits() == 9
    assert await tokens.available_permits() == 50


async def test_httpx_settles_for_more_and_a_custom_estimate_and_usage(store: Any) -> None:
    requests, tokens = await meters(store)
    answers = [httpx.Response(200, json={"used": 700})]
    async with client(
        requests,
        provider(answers, []),
        tokens=tokens,
        estimate=lambda request: 200,
        usage=lambda response: response.json()["used"],
    ) as http:
        await http.post("/a", json=PROMPT)
    assert await tokens.available_permits() == 1000 - 700


async def test_httpx_a_refused_call_hands_its_tokens_back_before_the_retry(
    store: Any, flavour: Flavour
) -> None:
    # (a clock that moves: on one held still, a grant at the very instant of one settled to
    # nothing, in a log left empty, is named as that one was, and its settle read as a resend)
    requests, tokens = await meters(store, clock=Ticking())
    answers = [
        flavour.httpx.Response(429, json={"error": "slow down"}, headers={"retry-after": "0"}),
        flavour.httpx.Response(200, json={"usage": {"total_tokens": 30}}),
    ]
    seen: list[Any] = []
    async with client(requests, provider(answers, seen), flavour, tokens=tokens) as http:
        response = await http.post("/a", json=PROMPT)
    assert (response.status_code, len(seen)) == (200, 2)
    assert await tokens.available_permits() == 1000 - 30


async def test_httpx_syncs_both_limiters_from_openai_headers(store: Any, flavour: Flavour) -> None:
    requests, tokens = await meters(store)
    headers = {
        "x-ratelimit-remaining-requests": "3",
        "x-ratelimit-reset-requests": "6m0s",
        "x-ratelimit-remaining-tokens": "400",
        "x-ratelimit-reset-tokens": "20s",
    }
    answers = [flavour.httpx.Response(200, json={"usage": {"total_tokens": 30}}, headers=headers)]
    async with client(requests, provider(answers, []), flavour, tokens=tokens) as http:
        await http.post("/a", json=PROMPT)
    assert await requests.available_permits() == 3
    assert await tokens.available_permits() == 400


@pytest.mark.parametrize(
    ("remaining", "reset"),
    [("-5", "1s"), ("9" * 400, "1s"), ("5", "9999-01-01T00:00:00Z"), ("x", "nan"), ("5", "-1s")],
)
async def test_httpx_hostile_quota_headers_are_bounded_or_ignored(
    store: Any, remaining: str, reset: str
) -> None:
    requests, tokens = await meters(store)
    headers = {"x-ratelimit-remaining-tokens": remaining, "x-ratelimit-reset-tokens": reset}
    answers = [httpx.Response(200, json={"usage": {"total_tokens": 30}}, headers=headers)]
    async with client(requests, provider(answers, []), tokens=tokens) as http:
        response = await http.post("/a", json=PROMPT)
    assert response.status_code == 200
    assert 0 <= await tokens.available_permits() <= 1000 - 30


async def test_the_clients_refuse_what_cannot_be_metered(store: Any) -> None:
    requests, tokens = await meters(store)
    sharded = ShardedRateLimiter("sharded", requests.backend, shards=2)
    with pytest.raises(InvalidArgumentError, match="ShardedRateLimiter"):
        RateLimitedTransport(sharded, tokens=tokens)
    with pytest.raises(InvalidArgumentError, match="go with tokens="):
        RateLimitedTransport(requests, estimate=lambda request: 1)
    with pytest.raises(InvalidArgumentError, match="another limiter"):
        RateLimitedClientMiddleware(requests, tokens=requests)
    with pytest.raises(InvalidArgumentError, match="tokens must be a RateLimiter"):
        RateLimitedClientMiddleware(requests, tokens=sharded)  # type: ignore[arg-type]
    answers = [httpx.Response(200, json={})]
    async with client(
        requests, provider(answers, []), tokens=tokens, estimate=lambda request: -1
    ) as http:
        with pytest.raises(InvalidArgumentError, match="estimate"):
            await http.post("/a", json=PROMPT)
    assert await requests.available_permits() == 10


# -- aiohttp ------------------------------------------------------------------------------------


@pytest.fixture
async def anthropic() -> AsyncIterator[TestServer]:
    """A provider that answers with Anthropic's usage and rate-limit headers."""
    reset = (datetime.now(timezone.utc) + timedelta(seconds=30)).isoformat()

    async def messages(request: web.Request) -> web.Response:
        await request.json()
        headers = {
            "anthropic-ratelimit-tokens-remaining": "600",
            "anthropic-ratelimit-tokens-reset": reset,
            "anthropic-ratelimit-requests-remaining": "4",
            "anthropic-ratelimit-requests-reset": reset,
        }
        usage = {"input_tokens": 12, "output_tokens": 20}
        return web.json_response({"usage": usage}, headers=headers)

    async def plain(request: web.Request) -> web.Response:
        return web.json_response({"usage": {"total_tokens": 25}})

    app = web.Application()
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/plain", plain)
    async with TestServer(app, host="127.0.0.1") as server:
        yield server


async def test_aiohttp_settles_the_usage_and_syncs_from_anthropic_headers(
    store: Any, anthropic: TestServer
) -> None:
    requests, tokens = await meters(store)
    middleware = RateLimitedClientMiddleware(requests, tokens=tokens)
    async with aiohttp.ClientSession(middlewares=[middleware]) as session:
        async with session.post(anthropic.make_url("/v1/plain"), json=PROMPT) as response:
            assert await response.json() == {"usage": {"total_tokens": 25}}
        assert await tokens.available_permits() == 1000 - 25
        async with session.post(anthropic.make_url("/v1/messages"), json=PROMPT) as response:
            assert response.status == 200
            assert (await response.json())["usage"]["output_tokens"] == 20  # read again
    assert await tokens.available_permits() == 600
    assert await requests.available_permits() == 4


async def test_aiohttp_takes_the_permit_and_the_tokens_all_or_nothing(
    store: Any, anthropic: TestServer
) -> None:
    requests, tokens = await meters(store, tokens=AIOHTTP_ESTIMATE + 10)
    assert await tokens.try_acquire(20)
    middleware = RateLimitedClientMiddleware(requests, tokens=tokens, timeout=0)
    async with aiohttp.ClientSession(middlewares=[middleware]) as session:
        with pytest.raises(RateLimited):
            await session.post(anthropic.make_url("/v1/plain"), json=PROMPT)
    assert await requests.available_permits() == 10


def syncs_of(
    limiter: Any, monkeypatch: pytest.MonkeyPatch, resets: list[int] | None = None
) -> list[str]:
    """The names of the limiters its store caps from now on (``sync``, or a settle's
    ``settle_and_sync``), in order; each cap's reset (µs) into ``resets``."""
    synced: list[str] = []
    kind = type(limiter.backend)
    sync, settle_and_sync = kind.sync, kind.settle_and_sync

    async def counted(self: Any, name: str, remaining: int, reset_us: int) -> None:
        synced.append(name)
        if resets is not None:
            resets.append(reset_us)
        await sync(self, name, remaining, reset_us)

    async def settled(self: Any, name: str, member: str, permits: int, *floor: int) -> Any:
        synced.append(name)
        if resets is not None:
            resets.append(floor[1])
        return await settle_and_sync(self, name, member, permits, *floor)

    monkeypatch.setattr(kind, "sync", counted)
    monkeypatch.setattr(kind, "settle_and_sync", settled)
    return synced


@pytest.mark.parametrize("store", ["memory"], indirect=True)
async def test_httpx_caps_nothing_while_the_provider_has_half_its_stated_quota_left(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests, tokens = await meters(store)
    synced = syncs_of(requests, monkeypatch)
    headers = {
        "x-ratelimit-limit-requests": "10",
        "x-ratelimit-remaining-requests": "5",  # half left: a cap would change nothing soon
        "x-ratelimit-reset-requests": "6m0s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "400",  # less than half: capped
        "x-ratelimit-reset-tokens": "20s",
    }
    answers = [httpx.Response(200, json={"usage": {"total_tokens": 30}}, headers=headers)]
    async with client(requests, provider(answers, []), tokens=tokens) as http:
        await http.post("/a", json=PROMPT)
    assert synced == ["llm-tokens"]  # one call per response saved
    assert await requests.available_permits() == 9
    assert await tokens.available_permits() == 400


@pytest.mark.parametrize("store", ["memory"], indirect=True)
async def test_httpx_caps_a_limiter_at_most_every_cap_every(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests, tokens = await meters(store)
    synced = syncs_of(requests, monkeypatch)
    headers = {"x-ratelimit-remaining-tokens": "400", "x-ratelimit-reset-tokens": "20s"}
    answers = [
        httpx.Response(200, json={"usage": {"total_tokens": 30}}, headers=headers) for _ in range(3)
    ]
    async with client(requests, provider(answers, []), tokens=tokens) as http:
        await http.post("/a", json=PROMPT)
        await http.post("/a", json=PROMPT)  # (at once: the count it carries waits)
        await asyncio.sleep(CAP_EVERY)
        await http.post("/a", json=PROMPT)
    assert synced == ["llm-tokens", "llm-tokens"]


@pytest.mark.looptime
@pytest.mark.parametrize("store", ["memory"], indirect=True)
async def test_httpx_caps_by_a_count_as_old_as_its_response(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The provider's count was sent with the response's headers: its reset runs from then,
    # not from when the body was read and settled (a count that reached the store late
    # would hold the limiter that much longer than the provider does).
    requests, tokens = await meters(store)
    resets: list[int] = []
    syncs_of(tokens, monkeypatch, resets)

    async def slow_usage(response: httpx.Response) -> int:
        await asyncio.sleep(1.5)  # (a body read slowly: the count ages meanwhile)
        return 30

    headers = {"x-ratelimit-remaining-tokens": "400", "x-ratelimit-reset-tokens": "2s"}
    answers = [httpx.Response(200, json={"usage": {"total_tokens": 30}}, headers=headers)]
    async with client(requests, provider(answers, []), tokens=tokens, usage=slow_usage) as http:
        await http.post("/a", json=PROMPT)
    assert len(resets) == 1
    assert resets[0] == pytest.approx(500_000, abs=10_000)


@pytest.mark.parametrize("store", ["memory"], indirect=True)
async def test_httpx_settles_and_caps_a_calls_tokens_in_one_call_to_the_store(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests, tokens = await meters(store)
    calls: list[str] = []
    kind = type(tokens.backend)
    for method in ("settle", "sync", "settle_and_sync"):

        def counted(original: Any, name: str) -> Any:
            async def call(self: Any, *args: Any, **options: Any) -> Any:
                calls.append(name)
                return await original(self, *args, **options)

            return call

        monkeypatch.setattr(kind, method, counted(getattr(kind, method), method))
    headers = {"x-ratelimit-remaining-tokens": "400", "x-ratelimit-reset-tokens": "20s"}
    answers = [httpx.Response(200, json={"usage": {"total_tokens": 30}}, headers=headers)]
    async with client(requests, provider(answers, []), tokens=tokens) as http:
        await http.post("/a", json=PROMPT)
    assert calls == ["settle_and_sync"]
    assert await tokens.available_permits() == 400
