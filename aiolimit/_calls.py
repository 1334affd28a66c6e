"""What the httpx and aiohttp clients share: a permit before every call, and a pause that every
process obeys after the server answered ``429`` (or ``503``) with ``Retry-After``.

>>> guard = CallGuard(limiter, permits=1, timeout=None, retry=True)
>>> await guard.before_call()                         # waits out a pause, then a permit
>>> response = await send(request)
>>> if await guard.pause_for(response.status, response.headers.get("Retry-After")):
...     ...                                           # everyone pauses; retry once

The pause lives in the limiter's store, as a companion limiter of rate 1 per pause whose one
permit is taken: its ``wait_time`` is the time left, for every process that shares the store,
and it disappears when the pause ends.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import time
from datetime import timezone

from ._limiter import RateLimiter, ShardedRateLimiter
from ._types import MAX_DURATION, Duration, RateType, to_micros
from .errors import InvalidArgumentError, NotConfiguredError, RateLimited

__all__ = ["PAUSE_STATUSES", "CallGuard", "SharedPause", "retry_after_seconds"]

PAUSE_STATUSES = frozenset({429, 503})
"""Statuses whose ``Retry-After`` pauses every caller."""

_LONGEST_PAUSE = MAX_DURATION.total_seconds()
# An acquire that took longer than this slept for a reserved slot, rather than one round trip.
_LOOK_AGAIN_AFTER = 0.01


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


class SharedPause:
    """A pause that every caller of a limiter obeys, in every process that shares its store.

    >>> pause = SharedPause(limiter)
    >>> await pause.start(30)       # the partner said Retry-After: 30
    >>> await pause.wait()          # anywhere: returns when the pause is over
    """

    __slots__ = ("_pause",)

    def __init__(self, limiter: RateLimiter | ShardedRateLimiter) -> None:
        # A NUL in its name: no limiter a user makes can share this one's state.
        self._pause = RateLimiter._shard(f"{limiter.name}\x00pause", limiter.backend)

    async def remaining(self) -> float:
        """Seconds until the pause is over; 0 when there is none."""
        try:
            return await self._pause.wait_time(1)
        except NotConfiguredError:
            return 0.0

    async def start(self, seconds: float) -> None:
        """Pauses every caller for ``seconds``, unless a longer pause is already on."""
        if to_micros(seconds, "seconds") <= 0 or await self.remaining() >= seconds:
            return
        await self._pause.set_rate(RateType.OVERALL, 1, seconds)
        await self._pause.try_acquire(1)  # the one permit: no one passes before `seconds`
        await self._pause.expire(seconds)  # and then the pause is gone

    async def wait(self, timeout: float | None = None) -> bool:
        """Waits until no pause is on; False at once if it lasts longer than ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (left := await self.remaining()) > 0:
            if deadline is not None and time.monotonic() + left > deadline:
                return False
            await asyncio.sleep(left)  # then look again: someone may have paused for longer
        return True


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


class CallGuard:
    """The steps around one outgoing call; see the module's docstring."""

    __slots__ = ("limiter", "pause", "permits", "retry", "timeout")

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
        self.pause = SharedPause(limiter)
        self.permits = permits
        self.timeout = None if timeout is None else to_micros(timeout, "timeout") / 1e6
        self.retry = retry

    async def before_call(self) -> None:
        """Waits out any pause, then for the permits; :class:`RateLimited` when that would
        take longer than the timeout."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            if not await self.pause.wait(_left(deadline)):
                raise RateLimited(self.limiter.name, await self.pause.remaining())
            asked = time.monotonic()
            if not await self.limiter.try_acquire(self.permits, timeout=_left(deadline)):
                raise RateLimited(self.limiter.name, await self.limiter.wait_time(self.permits))
            if time.monotonic() - asked <= _LOOK_AGAIN_AFTER or not await self.pause.remaining():
                return
            # It slept in a reserved slot, and a pause began meanwhile: sent after the pause,
            # with everyone else's, it would break the rate. Its permit goes back, and it
            # queues again once the pause is over.
            await self.limiter.release(self.permits)

    async def pause_for(self, status: int, retry_after: str | None) -> bool:
        """After a response: pauses everyone as a ``429``/``503`` with ``Retry-After`` asks;
        returns whether it did."""
        if status not in PAUSE_STATUSES:
            return False
        seconds = retry_after_seconds(retry_after)
        if seconds is None:
            return False
        await self.pause.start(seconds)
        return True
