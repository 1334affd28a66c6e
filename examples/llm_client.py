"""An LLM client that keeps to a provider's tokens per minute: reserve, then settle.

Each request reserves its estimated tokens (a token per 4 bytes of the prompt, plus its
``max_tokens``) together with one request permit; when the response says what it really
used (``usage.total_tokens``), the difference goes back to the budget, or is charged. The
provider here is simulated in process (an httpx ``MockTransport``): it allows 2000 tokens
per minute, answers 429 beyond that, and uses a random part of each ``max_tokens``.

    python examples/llm_client.py                                  # in-memory backend
    python examples/llm_client.py --redis redis://localhost:6379   # shared through Redis
    AIOLIMIT_REDIS_URL=redis://localhost:6379 python examples/llm_client.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time

import httpx
from redis.asyncio import Redis

from aiolimit import Backend, MemoryBackend, RateLimited, RateLimiter, RedisBackend
from aiolimit.httpx import RateLimitedTransport

TOKENS_PER_MINUTE = 2000
MAX_TOKENS = 300


class Provider:
    """A stand-in for an LLM API: a token budget per minute, usage in every answer, and
    OpenAI's rate-limit headers."""

    def __init__(self, tokens_per_minute: int) -> None:
        self.budget = tokens_per_minute
        self.used: list[tuple[float, int]] = []
        self.refused = 0
        self.random = random.Random(7)

    def handle(self, request: httpx.Request) -> httpx.Response:
        now = time.monotonic()
        self.used = [(at, n) for at, n in self.used if at > now - 60]
        left = self.budget - sum(n for _, n in self.used)
        body = json.loads(request.content)
        cost = len(body["messages"][0]["content"]) // 4 + self.random.randint(20, MAX_TOKENS)
        if cost > left:
            self.refused += 1
            return httpx.Response(429, json={"error": "tokens per minute"})
        self.used.append((now, cost))
        headers = {
            "x-ratelimit-remaining-tokens": str(left - cost),
            "x-ratelimit-reset-tokens": "60s",
        }
        return httpx.Response(200, json={"usage": {"total_tokens": cost}}, headers=headers)


async def main(backend: Backend) -> None:
    provider = Provider(TOKENS_PER_MINUTE)
    requests = RateLimiter("example-llm-requests", backend, rate="60/minute; keep_alive=120")
    tokens = RateLimiter(
        "example-llm-tokens", backend, rate=f"{TOKENS_PER_MINUTE}/minute; keep_alive=120"
    )
    transport = RateLimitedTransport(
        requests, httpx.MockTransport(provider.handle), tokens=tokens, timeout=0
    )
    answered = limited = 0
    async with httpx.AsyncClient(transport=transport, base_url="https://llm.example") as client:
        for i in range(12):
            prompt = {
                "model": "small",
                "messages": [{"role": "user", "content": f"question {i}: " + "why? " * 40}],
                "max_tokens": MAX_TOKENS,
            }
            try:
                response = await client.post("/v1/chat/completions", json=prompt)
            except RateLimited as exc:  # our budget says: later
                limited += 1
                print(f"request {i:2}: held back, retry after {exc.retry_after:.0f} s")
                continue
            answered += 1
            used = response.json()["usage"]["total_tokens"]
            left = await tokens.available_permits()
            print(f"request {i:2}: {response.status_code}, used {used:3} tokens, {left:4} left")
    print(f"{answered} answered, {limited} held back, {provider.refused} refused by the provider")
    await requests.delete()
    await tokens.delete()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--redis",
        metavar="URL",
        default=os.environ.get("AIOLIMIT_REDIS_URL") or None,
        help="a Redis URL (default: $AIOLIMIT_REDIS_URL, else the in-memory backend)",
    )
    args = parser.parse_args()
    store: Backend = RedisBackend(Redis.from_url(args.redis)) if args.redis else MemoryBackend()
    asyncio.run(main(store))
