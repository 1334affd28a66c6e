"""What the httpx and aiohttp clients share: a permit before every call, and a pause that every
process obeys after the server answered ``429`` (or ``503``) with ``Retry-After``.

>>> guard = CallGuard(limiter, permits=1, timeout=None, retry=True)
>>> await guard.before_call()                         # waits out a pause, then a permit
>>> response = await send(request)
>>> if await guard.pause_for(response.status, response.headers.get("Retry-After")):
...     ...                                           # everyone pauses; retry once

A call that could not even connect (``guard.unsent(acquired)``) hands back what it took;
one that failed after it was sent (a read timeout, a reset) keeps it, since the partner may
have counted it.

The pause is the limiter's ``pause()``: kept in its config, so every process that shares the
store obeys it, and reservations made before it move behind it. It lasts at most ``max_pause``
(15 minutes by default): one hostile or mistaken ``Retry-After`` (``999999999``, a date in
the year 9999) would otherwise stop every caller of the limiter, in every process, for years.
"""

from __future__ import annotations

import asyncio
import contextvars
import email.utils
import logging
import math
import re
import time
from collections.abc import Mapping
from datetime import timezone

from . import _observe
from ._acquire import Acquired, InFlight, take
from ._checks import check_permits, max_wait_of
from ._concurrency import ConcurrencyLimiter
from ._learn import Learner, call_learning
from ._limiter import RateLimiter
from ._meter import Caps, TokenMeter, sync_from
from ._request import Request, deadline_in, seconds
from ._sharded import ShardedRateLimiter
from ._types import MAX_DURATION, Duration, to_micros
from ._wakeup import note_sent
from .backends.base import Grant
from .errors import InvalidArgumentError, RateLimited

__all__ = [
    "DEFAULT_MAX_PAUSE",
    "PAUSE_STATUSES",
    "STALE_RETRIES",
    "CallGuard",
    "Refusals",
    "last_grant",
    "retry_after_seconds",
]

log = logging.getLogger("aiolimit")

PAUSE_STATUSES = frozenset({429, 503})
"""Statuses whose ``Retry-After`` pauses every caller."""

DEFAULT_MAX_PAUSE = 15 * 60
"""The longest pause a ``Retry-After`` starts, in seconds, unless the client says otherwise."""

_LONGEST_PAUSE = MAX_DURATION.total_seconds()
# RFC 9110 delta-seconds (ASCII digits only), with a decimal part read too.
_DELTA_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """The seconds a ``Retry-After`` value asks for: delta-seconds (a decimal is read too) or
    an HTTP-date (``now`` is the wall clock by default); None when absent or unreadable
    (negative, ``nan``, ``inf``, ``1e9``, garbage). A date in the past is 0; anything past
    10 years (``MAX_DURATION``, also a number too long for a float) is 10 years.

    >>> retry_after_seconds("120")
    120.0
    >>> retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0)
    10.0
    """
    if value is None:
        return None
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        return min(float(value), _LONGEST_PAUSE)  # 400 digits make inf: the longest
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    seconds = when.timestamp() - (time.time() if now is None else now)
    return min(max(seconds, 0.0), _LONGEST_PAUSE)


last_grant: contextvars.ContextVar[Acquired | None] = contextvars.ContextVar(
    "last_grant", default=None
)
"""The acquisition the guard just took for this task's call (what a test or a trace reads:
the grant's start, to tell how late the request left)."""


STALE_RETRIES = 2
"""How often a call asks again for permits read later than the fleet's margin covers."""


def grants_held(acquired: Acquired) -> list[tuple[RateLimiter, Grant]]:
    """The grants of ``acquired``, each with its limiter."""
    return [
        (limiter, attempt)
        for limiter, attempt in zip(acquired.limiters, acquired.attempts, strict=False)
        if isinstance(attempt, Grant) and isinstance(limiter, RateLimiter)
    ]


class CallGuard:
    """The steps around one outgoing call; see the module's docstring. With ``tokens`` (a
    :class:`TokenMeter`), a call's tokens too: estimated and taken with its permits, settled
    by its usage (``_meter``)."""

    __slots__ = (
        "_max_wait",
        "caps",
        "concurrency",
        "learning",
        "limiter",
        "max_pause",
        "meter",
        "permits",
        "refusals",
        "retry",
        "timeout",
    )

    def __init__(
        self,
        limiter: RateLimiter | ShardedRateLimiter,
        *,
        permits: int,
        timeout: Duration | None,
        retry: bool,
        max_pause: Duration = DEFAULT_MAX_PAUSE,
        concurrency: ConcurrencyLimiter | None = None,
        meter: TokenMeter | None = None,
        learn: bool | Learner = False,
    ) -> None:
        if concurrency is not None and not isinstance(concurrency, ConcurrencyLimiter):
            raise InvalidArgumentError(
                f"concurrency must be a ConcurrencyLimiter or None, not {concurrency!r}"
            )
        self.concurrency = concurrency
        if not isinstance(limiter, (RateLimiter, ShardedRateLimiter)):
            raise InvalidArgumentError(
                f"limiter must be a RateLimiter or ShardedRateLimiter, not {limiter!r}"
            )
        self._max_wait = max_wait = max_wait_of(timeout)
        self.limiter = limiter
        self.permits = check_permits(permits)
        self.timeout = None if max_wait is None else seconds(max_wait)
        self.retry = retry
        max_pause_us = to_micros(max_pause, "max_pause")
        if max_pause_us < 0:
            raise InvalidArgumentError(f"max_pause must be >= 0 seconds, not {max_pause!r}")
        self.max_pause = seconds(max_pause_us)
        self.meter = meter
        self.caps = Caps()
        self.refusals = Refusals()
        self.learning = call_learning(learn, limiter, None if meter is None else meter.learns)

    async def before_call(self, request: object = None) -> Acquired:
        """Waits for the permits (after any pause: a block holds every grant back), with the
        request's estimated tokens when metered, and with ``concurrency`` first for a slot
        (an :class:`InFlight`, whose slot the caller holds while the call is in flight);
        :class:`RateLimited` when that would take longer than the timeout."""
        slots = () if self.concurrency is None else ((self.concurrency, 1),)
        wanted = Request((self.limiter,), (self.permits,), deadline_in(self._max_wait), slots)
        for again in range(STALE_RETRIES, -1, -1):
            if self.meter is not None:
                acquired = await self.meter.take(wanted, request)
            else:  # (a learning client reserves only a little ahead: see _learn)
                learning = self.learning
                acquired = await take(wanted, None if learning is None else learning.paced)
            if not acquired:
                if isinstance(acquired, InFlight):
                    raise acquired.refusal()
                raise RateLimited(self.limiter.name, acquired.retry_after)
            # Sent now: how late, for the fleet's margin; a grant read later than the margin
            # covers (a process the machine did not run) goes back, and the call asks again.
            if not note_sent(grants_held(acquired)) or self.meter is not None or not again:
                break
            await acquired.release()
        last_grant.set(acquired)
        return acquired

    async def late(self, acquired: Acquired, connected: bool = False) -> bool:
        """The call is being written now, on the permits ``acquired`` before: how late, for
        the fleet's margin; one later than that margin covers (a process the machine did not
        run since) is handed back, and True says to ask again. (Metered calls keep theirs,
        as ``before_call`` does.) ``connected``: a new connection was made for it: where the
        limiter keeps no measured margin (an exact rate, a margin of its own), nothing of
        its set-up is covered, and its permits go back whatever it took."""
        if self.meter is not None:
            return False
        if not note_sent(grants_held(acquired), unmeasured=connected):
            return False
        await acquired.release()
        return True

    async def unsent(self, acquired: Acquired) -> None:
        """The call never reached the partner (no connection could be made): what it took
        goes back, its own grants by member (its permits, its tokens when metered; its slot
        is released already). A call that failed once sent keeps them: the partner may
        have counted it."""
        if self.meter is not None:
            await self.meter.unsent(acquired)
        else:
            await acquired.release()

    async def after_headers(
        self, headers: Mapping[str, str], status: int = 200, acquired: Acquired | None = None
    ) -> None:
        """A provider's count of requests left, when its headers say, taken as a floor
        (``cap_remaining``; its tokens left: after the settle, ``TokenMeter.settle``); with
        ``learn``, what the answer teaches the learners."""
        await sync_from(headers, self.limiter, "requests", self.caps)
        if self.learning is not None and acquired is not None:
            await self.learning.after(status, headers, acquired)

    async def pause_for(self, status: int, retry_after: str | None) -> bool:
        """After a response: pauses everyone as a ``429``/``503`` with ``Retry-After`` asks;
        returns whether it did. Every such status is reported (``Observer.partner_refused``)
        and each episode logged once (:class:`Refusals`)."""
        if status not in PAUSE_STATUSES:
            return False
        seconds = retry_after_seconds(retry_after)
        capped = seconds is not None and seconds > self.max_pause
        if seconds is not None:
            seconds = min(seconds, self.max_pause)
        alone = (
            seconds is not None
            and self.learning is not None
            and seconds <= self.learning.short_pause()
        )  # (the learner's cut answers it; this call alone waits)
        self.refusals.report(
            self.limiter.name, status, seconds, retry_after if capped else None, alone=alone
        )
        if seconds is None:
            return False
        if alone:
            if self.retry:
                await asyncio.sleep(seconds)
            return True
        if seconds > 0:
            await self.limiter.pause(seconds)
        return True


class Refusals:
    """What a client's guard says of the statuses that refused its calls: each to the
    observer; one WARNING per episode, which starts with a refusal outside any other and
    lasts as long as the pauses its refusals start (at least ``QUIET`` seconds), so the
    requests already in flight when the first was refused log nothing more."""

    __slots__ = ("_until",)

    QUIET = 1.0

    def __init__(self) -> None:
        self._until = -math.inf  # the current episode's end, on the event loop's clock

    def report(
        self,
        name: str,
        status: int,
        pause: float | None,
        capped: str | None,
        *,
        alone: bool = False,
    ) -> None:
        observer = _observe.current
        if observer is not None:
            observer.partner_refused(name, status, pause)
        now = asyncio.get_running_loop().time()
        starts = now >= self._until
        self._until = max(self._until, now + max(pause or 0.0, self.QUIET))
        if not starts:
            return
        if pause is None:
            log.warning(
                "limiter %r: the server answered %d without a usable Retry-After; not pausing",
                name,
                status,
            )
        elif alone:
            log.warning(
                "limiter %r: the server answered %d; learning from it, this call alone waits %g s",
                name,
                status,
                pause,
            )
        elif capped is None:
            log.warning(
                "limiter %r: the server answered %d; pausing every caller %g s", name, status, pause
            )
        else:
            log.warning(
                "limiter %r: the server answered %d; its Retry-After %.40r asks for a longer "
                "pause than max_pause; pausing every caller %g s",
                name,
                status,
                capped,
                pause,
            )
