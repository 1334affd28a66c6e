"""What the token meter tests share: a request limiter and a token limiter on a clock the
test holds still, and the prompt they send."""

from __future__ import annotations

import json
from typing import Any

import httpx
from conformance import ManualClock, new_client

from aiolimit import RateLimiter, RateLimiterConfig, RateType

PROMPT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
# The default estimate: a token per 4 bytes of the body, plus its max_tokens (httpx writes
# compact JSON; aiohttp json.dumps's).
ESTIMATE = len(httpx.Request("POST", "http://llm.test", json=PROMPT).content) // 4 + 1 + 100
AIOHTTP_ESTIMATE = len(json.dumps(PROMPT).encode()) // 4 + 1 + 100


class Ticking(ManualClock):
    """A clock one microsecond further at every reading."""

    def __call__(self) -> float:
        self.advance(1e-6)
        return super().__call__()


async def meters(
    store: Any, tokens: int = 1000, clock: ManualClock | None = None
) -> tuple[RateLimiter, RateLimiter]:
    backend = new_client(store, clock=clock or ManualClock())
    requests = RateLimiter("llm-requests", backend)
    await requests.set_rate(RateLimiterConfig.build(RateType.OVERALL, 10, 60))
    budget = RateLimiter("llm-tokens", backend)
    await budget.set_rate(RateLimiterConfig.build(RateType.OVERALL, tokens, 60))
    return requests, budget
