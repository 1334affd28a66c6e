"""A partner counts arrivals, not our grants: 5 processes x 4 tasks at exactly a partner's
quota, through ``RateLimitedTransport`` (httpx), ``RateLimitedClientMiddleware`` (aiohttp)
and plain ``acquire()``, against a partner that answers 429 past its quota by its own clock
in a strict sliding window, in fixed windows and as a token bucket (``tools/partner.py``).
The limiter is given the partner's quota and the margin the docs recommend.

Real time, real processes, a real redis-server: the partners' own clocks are the judges.
"""

from __future__ import annotations

import pytest

from tools import LocalRedis
from tools.partner import Trial, summary, trial

pytestmark = pytest.mark.slow

MARGIN = 0.05  # the docs' margin for a busy 2-core machine (docs/http-clients.md)


def test_the_partner_answers_no_429_and_gets_its_quota(redis_server: LocalRedis) -> None:
    spec = Trial(
        redis_server.url,
        processes=5,
        tasks=4,
        rate=10,
        interval=1.0,
        duration=12.0,
        margin=MARGIN,
        partners=(("sliding", "httpx"), ("fixed", "aiohttp"), ("bucket", "acquire")),
        prefix="test-partner",
    )
    results = trial(spec)
    print(summary(results))
    for seen in results:
        assert seen.windows >= 10, summary(results)
        if seen.stall > MARGIN:
            # A caller's process did not run for longer than the margin (the machine is
            # busy with other work): a late request then is not the limiter's to prevent.
            # What the limiter still owes: no partner window over the quota but by those.
            continue
        assert seen.refused == 0, summary(results)
        assert seen.share >= 0.95 * (1 - 0.001), summary(results)  # (10 per 1.05 s: 95.2 %)
    quiet = [seen for seen in results if seen.stall <= MARGIN]
    assert quiet, f"every run stalled past the margin: {summary(results)}"
