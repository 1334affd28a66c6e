"""``learn=True`` on the HTTP clients, against a local partner that keeps a hidden quota
(``tools/partner.py``: a strict sliding window, ``429`` with ``Retry-After`` past it).

Real time: the partner is a uvicorn server in a thread. Each run is a few seconds (marked
slow), and its checks are loose where timing matters: the learned rate went down from the
ceiling towards the partner's quota, never below the floor, and the partner refused few.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import httpx
import pytest

from aiolimit import (
    InvalidArgumentError,
    Learner,
    MemoryBackend,
    RateLimiter,
    RateLimiterConfig,
    RateType,
)
from aiolimit.aiohttp import RateLimitedClientMiddleware
from aiolimit.httpx import RateLimitedTransport
from tools.partner import Partner, serve

pytestmark = pytest.mark.slow

MARGIN = 0.05  # a partner that counts arrivals needs one (docs: HTTP clients)


async def _httpx_calls(limiter: RateLimiter, url: str, seconds: float, tasks: int = 4) -> None:
    transport = RateLimitedTransport(limiter, learn=True)
    async with httpx.AsyncClient(transport=transport) as client:

        async def caller() -> None:
            stop = time.monotonic() + seconds
            while time.monotonic() < stop:
                await client.get(f"{url}/call")

        await asyncio.gather(*(caller() for _ in range(tasks)))


async def _aiohttp_calls(limiter: RateLimiter, url: str, seconds: float, tasks: int = 4) -> None:
    middleware = RateLimitedClientMiddleware(limiter, learn=True)
    async with aiohttp.ClientSession(middlewares=[middleware]) as session:

        async def caller() -> None:
            stop = time.monotonic() + seconds
            while time.monotonic() < stop:
                async with session.get(f"{url}/call") as response:
                    await response.read()

        await asyncio.gather(*(caller() for _ in range(tasks)))


@pytest.mark.parametrize("calls", [_httpx_calls, _aiohttp_calls], ids=["httpx", "aiohttp"])
async def test_a_client_learns_a_hidden_quota_from_its_429s(calls, caplog) -> None:
    caplog.set_level("WARNING", "aiolimit")
    partner = Partner(5, 1.0, "sliding")
    limiter = RateLimiter(
        "hidden",
        MemoryBackend(),
        rate=RateLimiterConfig.build(RateType.OVERALL, 20, 1, margin=MARGIN),
    )
    with serve(partner) as url:
        await calls(limiter, url, 4.0)
    learned = await Learner(limiter).read()
    assert 1 <= learned.permits <= 7, learned  # from 10 (half of 20) down to the quota's
    served, refused = len(partner.arrivals), partner.refused
    assert len(refused) <= 0.5 * served, (len(refused), served)  # (the first cut's, mostly)
    assert served >= 0.6 * 5 * 4, served  # it kept calling: the floor, never a stop
    late = [at for at in refused if at > partner.arrivals[0] + 2.5]
    assert len(late) <= 2, (late, refused)  # learned: few after the first seconds
    said = [record.getMessage() for record in caplog.records]  # (a 1 s Retry-After: one interval)
    assert any("learning from it, this call alone waits 1 s" in line for line in said), said
    assert not any("pausing every caller" in line for line in said), said


@pytest.mark.parametrize("calls", [_httpx_calls, _aiohttp_calls], ids=["httpx", "aiohttp"])
async def test_a_client_takes_a_stated_quota_at_its_first_answer(calls) -> None:
    partner = Partner(7, 1.0, "sliding", states=True)
    limiter = RateLimiter(
        "stated",
        MemoryBackend(),
        rate=RateLimiterConfig.build(RateType.OVERALL, 20, 1, margin=MARGIN),
    )
    with serve(partner) as url:
        await calls(limiter, url, 3.0)
    learned = await Learner(limiter).read()
    assert (learned.permits, learned.stated) == (7, 7)
    # (the first window's requests land late, behind their connections: a few 429s then)
    late = [at for at in partner.refused if at > partner.arrivals[0] + 1.5]
    assert len(late) <= 1, (late, partner.refused)


def test_learn_takes_true_false_or_a_learner_of_the_clients_limiter() -> None:
    limiter = RateLimiter("learns", MemoryBackend(), rate="20/second")
    other = RateLimiter("other", MemoryBackend(), rate="20/second")
    RateLimitedTransport(limiter, learn=Learner(limiter, max_hold=2))
    for wrong in ("yes", 1, Learner(other)):
        with pytest.raises(InvalidArgumentError):
            RateLimitedTransport(limiter, learn=wrong)


async def _hostile(scope, receive, send) -> None:
    """Refuses everything, stating absurd limits."""
    if scope["type"] != "http":
        return
    headers = [
        (b"x-ratelimit-limit-requests", b"0"),
        (b"ratelimit-policy", b'"x";q=99999999999999999999999;w=0'),
        (b"retry-after", b"0"),
    ]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": b"no"})


async def test_a_hostile_partner_drives_the_rate_to_the_floor_never_to_a_stop() -> None:
    limiter = RateLimiter(
        "hostile", MemoryBackend(), rate=RateLimiterConfig.build(RateType.OVERALL, 20, 0.1)
    )
    transport = RateLimitedTransport(limiter, learn=True, retry=False)
    answered = 0
    with serve(_hostile) as url:
        async with httpx.AsyncClient(transport=transport) as client:
            stop = time.monotonic() + 2.0
            while time.monotonic() < stop:
                assert (await client.get(f"{url}/call")).status_code == 429
                answered += 1
    learned = await Learner(limiter).read()
    assert learned.permits == 1  # the floor: 5 % of 20, at least one permit per interval
    assert answered >= 10  # still calling, one permit per 0.1 s


async def test_a_tokens_limiter_learns_its_budget_from_the_stated_tokens_limit() -> None:
    from tools.llm_provider import Provider

    provider = Provider(tpm=6000, rpm=120, window=60.0)
    backend = MemoryBackend()
    requests = RateLimiter("llm-rpm", backend, rate="600/minute")
    tokens = RateLimiter("llm-tpm", backend, rate="60000/minute")
    transport = RateLimitedTransport(requests, tokens=tokens, learn=True)
    with serve(provider) as url:
        async with httpx.AsyncClient(transport=transport) as client:
            body = {"prompt_tokens": 100, "max_tokens": 50}
            response = await client.post(f"{url}/v1/chat/completions", json=body)
            assert response.status_code == 200
    assert (await Learner(requests).read()).permits == 120  # x-ratelimit-limit-requests
    assert (await Learner(tokens).read()).permits == 6000  # x-ratelimit-limit-tokens
