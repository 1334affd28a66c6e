"""The official OpenAI SDK, kept to a provider's requests and tokens per minute.

`AsyncOpenAI(http_client=httpx.AsyncClient(transport=RateLimitedTransport(...)))`: every call
the SDK makes takes a request permit and reserves its tokens (prompt + `max_tokens`), settled
by the `usage` of its answer. Who retries a 429: the transport. It pauses every caller of
the limiter, in every process, for the `Retry-After`, then sends the call once more with a
permit of its own; the SDK sees the answer and retries nothing (its own retries stay on for
what the transport does not retry: a 5xx, a dropped connection). The provider here runs in
process (an httpx `MockTransport` behind the transport) and answers one 429 on purpose.

    python examples/openai_sdk.py                                  # in-memory backend
    python examples/openai_sdk.py --redis redis://localhost:6379   # shared through Redis
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sys

import httpx
import openai
from redis.asyncio import Redis

from aiolimit import Backend, MemoryBackend, Observer, RateLimiter, RedisBackend, observe
from aiolimit.httpx import RateLimitedTransport

CALLS = 12
REFUSE = 4  # the provider's 4th arrival: 429, Retry-After 1 (say, maintenance)


class Provider:
    """A stand-in for the chat completions API: usage in every answer, OpenAI's rate-limit
    headers, and one 429."""

    def __init__(self) -> None:
        self.arrivals = self.refused = 0
        self.random = random.Random(7)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.arrivals += 1
        if self.arrivals == REFUSE:
            self.refused += 1
            return httpx.Response(429, headers={"retry-after": "1"}, json={"error": "busy"})
        body = json.loads(request.content)
        prompt = len(body["messages"][0]["content"]) // 4
        completion = self.random.randint(5, body["max_tokens"])
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        answer = {
            "id": f"chatcmpl-{self.arrivals}",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "fine"},
                }
            ],
            "usage": usage,
        }
        return httpx.Response(200, json=answer)


class Grants(Observer):
    """The permits each limiter granted in this process."""

    def __init__(self) -> None:
        self.by_name: dict[str, int] = {}

    def granted(self, name: str, permits: int, waited: float) -> None:
        self.by_name[name] = self.by_name.get(name, 0) + permits


async def main(backend: Backend) -> None:
    provider, grants = Provider(), Grants()
    observe(grants)
    requests = RateLimiter("example-openai-requests", backend, rate="6/second; keep_alive=120")
    tokens = RateLimiter("example-openai-tokens", backend, rate="4000/minute; keep_alive=120")
    transport = RateLimitedTransport(requests, httpx.MockTransport(provider.handle), tokens=tokens)
    client = openai.AsyncOpenAI(
        api_key="sk-example",
        base_url="https://llm.example/v1",
        http_client=httpx.AsyncClient(transport=transport),
    )

    async def ask(i: int) -> int:
        completion = await client.chat.completions.create(
            model="small",
            messages=[{"role": "user", "content": f"question {i}: " + "why? " * 20}],
            max_tokens=100,
        )
        assert completion.usage is not None
        return completion.usage.total_tokens

    used = await asyncio.gather(*(ask(i) for i in range(CALLS)))
    sys.stdout.flush()
    await client.close()
    print(f"{len(used)} answers, {sum(used)} tokens used, SDK errors: 0")
    print(
        f"provider: {provider.arrivals} arrivals, {provider.refused} refused (429); "
        f"permits granted: {grants.by_name['example-openai-requests']} "
        f"(one per arrival: the retry after the pause took its own, the SDK retried none)"
    )
    await requests.delete()
    await tokens.delete()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis", help="a Redis URL (default: AIOLIMIT_REDIS_URL, else memory)")
    url = parser.parse_args().redis or os.environ.get("AIOLIMIT_REDIS_URL")
    # The pause a 429 starts is logged once (logger "aiolimit"): shown here with the rest.
    logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s")
    store: Backend = RedisBackend(Redis.from_url(url)) if url else MemoryBackend()
    asyncio.run(main(store))
