"""What the settle tests share: a limiter on a clock the test moves, and its grants."""

from __future__ import annotations

from typing import Any

import pytest
from conformance import ManualClock, new_client

from aiolimit import Algorithm, RateLimiterConfig, RateType
from aiolimit.backends import Backend, Grant

OVERALL, PER_CLIENT = RateType.OVERALL, RateType.PER_CLIENT
SLIDING, BUCKET, FIXED = Algorithm.SLIDING_WINDOW, Algorithm.TOKEN_BUCKET, Algorithm.FIXED_WINDOW
ALGORITHMS = pytest.mark.parametrize("algorithm", list(Algorithm), ids=lambda a: a.name.lower())
RATE_TYPES = pytest.mark.parametrize("rate_type", list(RateType), ids=lambda t: t.name.lower())
NAME = "llm"


async def limiter(
    store: Any,
    algorithm: Algorithm,
    rate_type: RateType = OVERALL,
    rates: str = "10/minute",
    max_debt: int | None = None,
) -> tuple[ManualClock, Backend]:
    """A limiter ``NAME`` on a clock the test moves (starting at a window's start)."""
    clock = ManualClock()
    backend = new_client(store, "client-a", clock=clock)
    config = RateLimiterConfig.build(rate_type, rates, algorithm=algorithm, max_debt=max_debt)
    assert await backend.set_rate(NAME, config, "set", False)
    return clock, backend


async def take(backend: Backend, permits: int, wait: bool = False) -> Grant:
    grant = await backend.try_acquire(NAME, permits, None if wait else 0)
    assert isinstance(grant, Grant), grant
    return grant
