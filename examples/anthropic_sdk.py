"""The official Anthropic SDK, kept to a provider's requests, input and output tokens per minute.

`AsyncAnthropic(http_client=httpx2.AsyncClient(transport=RateLimitedTransport(...)))`: every
call the SDK makes takes a request permit and reserves its input tokens (the prompt) and its
output tokens (`max_tokens`), each on a limiter of its own as Anthropic limits them, settled
by the `usage` of its answer (`input_tokens`, `output_tokens`). The SDK takes an httpx2
client only: `aiolimit.httpx2` is the transport for it. Who retries a 429: the transport. It
pauses every caller of the limiter, in every process, for the `Retry-After`, then sends the
call once more with a permit of its own; the SDK sees the answer and retries nothing (its own
retries stay on for what the transport does not retry: a 5xx, a dropped connection). The
provider here runs in process (an httpx2 `MockTransport` behind the transport) and answers
one 429 on purpose.

    python examples/anthropic_sdk.py                                  # in-memory backend
    python examples/anthropic_sdk.py --redis redis://localhost:6379   # shared through Redis
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sys

import anthropic
import httpx2
from redis.asyncio import Redis

from aiolimit import Backend, MemoryBackend, Observer, RateLimiter, RedisBackend, observe
from aiolimit.httpx2 import RateLimitedTransport

CALLS = 12
REFUSE = 4  # the provider's 4th arrival: 429, Retry-After 1 (say, maintenance)


class Provider:
    """A stand-in for the messages API: usage in every answer, Anthropic's rate-limit
    headers for input and output tokens, and one 429."""

    def __init__(self) -> None:
        self.arrivals = self.refused = 0
        self.random = random.Random(7)

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        self.arrivals += 1
        if self.arrivals == REFUSE:
            self.refused += 1
            return httpx2.Response(429, headers={"retry-after": "1"}, json={"type": "error"})
        body = json.loads(request.content)
        usage = {
            "input_tokens": len(body["messages"][0]["content"]) // 4,
            "output_tokens": self.random.randint(5, body["max_tokens"]),
        }
        answer = {
            "id": f"msg_{self.arrivals}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": "fine"}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }
        return httpx2.Response(200, json=answer)


class Grants(Observer):
    """The permits each limiter granted in this process."""

    def __init__(self) -> None:
        self.by_name: dict[str, int] = {}

    def granted(self, name: str, permits: int, waited: float) -> None:
        self.by_name[name] = self.by_name.get(name, 0) + permits


async def main(backend: Backend) -> None:
    provider, grants = Provider(), Grants()
    observe(grants)
    requests = RateLimiter("example-anthropic-requests", backend, rate="6/second; keep_alive=120")
    tokens = {
        "input": RateLimiter(
            "example-anthropic-input", backend, rate="4000/minute; keep_alive=120"
        ),
        "output": RateLimiter(
            "example-anthropic-output", backend, rate="2000/minute; keep_alive=120"
        ),
    }
    transport = RateLimitedTransport(requests, httpx2.MockTransport(provider.handle), tokens=tokens)
    client = anthropic.AsyncAnthropic(
        api_key="sk-ant-example",
        base_url="https://llm.example",
        http_client=httpx2.AsyncClient(transport=transport),
    )

    async def ask(i: int) -> tuple[int, int]:
        message = await client.messages.create(
            model="small",
            messages=[{"role": "user", "content": f"question {i}: " + "why? " * 20}],
            max_tokens=100,
        )
        return message.usage.input_tokens, message.usage.output_tokens

    used = await asyncio.gather(*(ask(i) for i in range(CALLS)))
    sys.stdout.flush()
    await client.close()
    read, written = sum(u[0] for u in used), sum(u[1] for u in used)
    print(f"{len(used)} answers, {read} input and {written} output tokens used, SDK errors: 0")
    print(
        f"provider: {provider.arrivals} arrivals, {provider.refused} refused (429); "
        f"permits granted: {grants.by_name['example-anthropic-requests']} "
        f"(one per arrival: the retry after the pause took its own, the SDK retried none)"
    )
    await requests.delete()
    for limiter in tokens.values():
        await limiter.delete()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis", help="a Redis URL (default: AIOLIMIT_REDIS_URL, else memory)")
    url = parser.parse_args().redis or os.environ.get("AIOLIMIT_REDIS_URL")
    # The pause a 429 starts is logged once (logger "aiolimit"): shown here with the rest.
    logging.basicConfig(stream=sys.stdout, format="%(levelname)s %(name)s: %(message)s")
    store: Backend = RedisBackend(Redis.from_url(url)) if url else MemoryBackend()
    asyncio.run(main(store))
