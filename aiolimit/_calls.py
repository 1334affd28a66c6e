"""What the httpx and aiohttp clients share: a permit before every call, and a pause that every
process obeys after the server answered ``429`` (or ``503``) with ``Retry-After``.

>>> guard = CallGuard(limiter, permits=1, timeout=None, retry=True)
>>> await guard.before_call()                         # waits out a pause, then a permit
>>> response = await send(request)
>>> if await guard.pause_for(response.status, response.headers.get("Retry-After")):
...     ...                                           # everyone pauses; retry once

The pause is the limiter's ``block()``: kept in its config, so every process that shares the
store obeys it, and reservations made before it move behind it.
"""

from __future__ import annotations

import email.utils
import math
import time
from datetime import timezone

from ._limiter import RateLimiter
from ._sharded import ShardedRateLimiter
from ._types import MAX_DURATION, Duration, to_micros
from .errors import InvalidArgumentError, RateLimited

__all__ = ["PAUSE_STATUSES", "CallGuard", "retry_after_seconds"]

PAUSE_STATUSES = frozenset({429, 503})
"""Statuses whose ``Retry-After`` pauses every caller."""

_LONGEST_PAUSE = MAX_DURATION.total_seconds()


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """The seconds a ``Retry-After`` value asks for: delta-seconds (a decimal is read too) or
    an HTTP-date (``now`` is the wall clock by default); None when absent or unreadable. A
    date in the past is 0.

    >>> retry_after_seconds("120")
    120.0
    >>> retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0)
    10.0
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        seconds = when.timestamp() - (time.time() if now is None else now)
        return min(max(seconds, 0.0), _LONGEST_PAUSE)
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, _LONGEST_PAUSE)


class CallGuard:
    """The steps around one outgoing call; see the module's docstring."""

    __slots__ = ("limiter", "permits", "retry", "timeout")

    def __init__(
        self,
        limiter: RateLimiter | ShardedRateLimiter,
        *,
        permits: int,
        timeout: Duration | None,
        retry: bool,
    ) -> None:
        if not isinstance(limiter, (RateLimiter, ShardedRateLimiter)):
            raise InvalidArgumentError(
                f"limiter must be a RateLimiter or ShardedRateLimiter, not {limiter!r}"
            )
        if timeout is not None and to_micros(timeout, "timeout") < 0:
            raise InvalidArgumentError(f"timeout must be >= 0 seconds or None, not {timeout!r}")
        self.limiter = limiter
        self.permits = permits
        self.timeout = None if timeout is None else to_micros(timeout, "timeout") / 1e6
        self.retry = retry

    async def before_call(self) -> None:
        """Waits for the permits (after any pause: a block holds every grant back);
        :class:`RateLimited` when that would take longer than the timeout."""
        if not await self.limiter.try_acquire(self.permits, timeout=self.timeout):
            raise RateLimited(self.limiter.name, await self.limiter.wait_time(self.permits))

    async def pause_for(self, status: int, retry_after: str | None) -> bool:
        """After a response: pauses everyone as a ``429``/``503`` with ``Retry-After`` asks;
        returns whether it did."""
        if status not in PAUSE_STATUSES:
            return False
        seconds = retry_after_seconds(retry_after)
        if seconds is None:
            return False
        if seconds > 0:
            await self.limiter.block(seconds)
        return True
