"""The permit path: every way of taking permits comes through :func:`acquire_all`'s core.

>>> acquired = await aiolimit.acquire_all([(everyone, 1), (per_user, 1)], timeout=0.5)
>>> if not acquired:
...     raise TooBusy(retry_after=acquired.retry_after)

One attempt per limiter, all sent together (one round trip on Redis: the backend's coalescer
batches them), all or nothing: when one refuses, the others' grants go back, each by its
member. When every limiter grants, reservations are slept out on the event loop's timer; a
limiter that was blocked meanwhile (``block()`` from any process) moves the whole request
behind its block. Each limiter is reported to the observer. After the store failed, calls
fail at once for a short, growing back-off (:class:`Breaker`) while one call probes.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Coroutine, Hashable, Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from . import _observe
from ._breaker import Breaker, breaker_of, charge, enter_all
from ._observe import Observer
from ._types import _MAX_SECONDS, MAX_RATE, Duration, exceeds_max_duration, shown, to_micros
from .backends._protocol import parse_grant
from .backends.base import Attempt, Grant, Refusal, Started, hand_backs_failed
from .errors import BackendError, InvalidArgumentError, LimiterError

if TYPE_CHECKING:
    from ._limiter import RateLimiter

__all__ = ["Acquired", "Breaker", "acquire_all", "breaker_of"]


def max_wait_of(timeout: Duration | None, what: str = "timeout") -> int | None:
    """A public timeout as the longest wait in microseconds; None waits as long as it takes.
    Every surface's timeout (or ``wait``) is checked here.

    A timeout longer than MAX_DURATION (infinity included) is no limit: no interval is that
    long, so no wait can be. Any negative timeout is refused, even one that rounds to 0 µs."""
    if timeout.__class__ is int and 0 <= timeout <= _MAX_SECONDS:  # (0: the default)
        return timeout * 1_000_000
    if timeout is None or exceeds_max_duration(timeout):
        return None
    max_wait = to_micros(timeout, what)  # (a number or a timedelta from here on)
    if max_wait < 0 or (not isinstance(timeout, timedelta) and timeout < 0):
        raise InvalidArgumentError(f"{what} must be >= 0 or None, not {timeout!r}")
    return max_wait


def check_permits(permits: object) -> int:
    if permits.__class__ is int and 1 <= permits <= MAX_RATE:
        return permits
    if isinstance(permits, bool) or not isinstance(permits, int) or not 1 <= permits <= MAX_RATE:
        raise InvalidArgumentError(
            f"permits must be an int from 1 to {MAX_RATE} (MAX_RATE), not {shown(permits)}"
        )
    return permits


class Acquired:
    """What :func:`acquire_all` did: true when every limiter granted.

    ``attempts`` holds the last answer of each limiter, in the order asked (a refusal's
    ``retry_in`` says when that limiter could grant); ``waited`` the seconds slept for
    reservations; ``retry_after`` the seconds until every refusing limiter could grant (0.0
    when granted). :meth:`release` hands back exactly these grants.
    """

    __slots__ = ("_released", "attempts", "limiters", "permits", "waited")

    def __init__(
        self,
        limiters: Sequence[RateLimiter],
        permits: Sequence[int],
        attempts: Sequence[Attempt],
        waited: float,
    ) -> None:
        self.limiters = tuple(limiters)
        self.permits = tuple(permits)
        self.attempts = tuple(attempts)
        self.waited = waited
        self._released = False

    @property
    def granted(self) -> bool:
        for attempt in self.attempts:  # noqa: SIM110 (a loop: no generator to make)
            if not isinstance(attempt, Grant):
                return False
        return True

    def __bool__(self) -> bool:
        return self.granted

    @property
    def retry_after(self) -> float:
        return max((a.retry_in for a in self.attempts if isinstance(a, Refusal)), default=0) / 1e6

    def __repr__(self) -> str:
        names = ", ".join(limiter.name for limiter in self.limiters)
        return f"Acquired(granted={self.granted}, limiters=[{names}], waited={self.waited:.3f})"

    async def release(self) -> None:
        """Hands back the grants of this acquisition (of a request that is not served after
        all), each by its member; a failure is logged, never raised. Once only."""
        if not self._released:
            self._released = True
            await _release(_grants(self.limiters, self.attempts))


@functools.cache
def _limiter_type() -> type[RateLimiter]:
    """RateLimiter (imported at first use: its module imports this one; once, not per call)."""
    from ._limiter import RateLimiter

    return RateLimiter


async def acquire_all(
    requests: Iterable[tuple[RateLimiter, int]], *, timeout: Duration | None = 0
) -> Acquired:
    """Takes permits from several limiters at once, all or nothing.

    >>> if not await aiolimit.acquire_all([(everyone, 1), (per_user, 1)], timeout=0.5):
    ...     return Response(status_code=429)

    ``requests`` are ``(limiter, permits)`` pairs (a ``PER_CLIENT`` limiter for a client is
    ``limiter.for_client(client_id)``). ``timeout`` as for :meth:`RateLimiter.try_acquire`:
    when every limiter can grant within it, each reserves its slot and this sleeps until the
    last one starts; when one cannot, nothing is taken (the others' grants are handed back)
    and the result is false, with ``retry_after``. Errors (``BackendError``,
    ``NotConfiguredError``, ``InvalidArgumentError``) are raised after handing back the
    others' grants. A limiter may appear once (the same name and client id on one store:
    one server and key prefix, or one ``MemoryBackend`` and its views).
    """
    limiter_type = _limiter_type()
    pairs = requests if requests.__class__ is list else list(requests)
    limiters: list[RateLimiter] = []
    permits: list[int] = []
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2 or not isinstance(pair[0], limiter_type):
            break
        limiters.append(pair[0])
        permits.append(check_permits(pair[1]))
    if not pairs or len(limiters) < len(pairs):
        raise InvalidArgumentError(
            f"requests must be a non-empty list of (RateLimiter, permits) pairs, not {shown(pairs)}"
        )
    if len(limiters) > 1 and len(set(map(_identity, limiters))) != len(limiters):
        raise InvalidArgumentError("a limiter appears twice in one acquire_all")
    for limiter in limiters:  # a rate given at construction, not stored yet
        if limiter._setup is not None and not limiter._setup.done:
            await limiter._setup.ensure(limiter)
    return await acquire(limiters, permits, max_wait_of(timeout), _observe.current)


def _identity(limiter: RateLimiter) -> tuple[Hashable, str, str]:
    """What makes two limiter objects one limiter: the store, the name and the client id."""
    backend = limiter._backend
    return (backend.store_id, limiter._name, backend.client_id)


def acquire(
    limiters: Sequence[RateLimiter],
    permits: Sequence[int],
    max_wait: int | None,
    observer: Observer | None,
    label: str | None = None,
    first: list[Attempt] | None = None,
) -> Coroutine[Any, Any, Acquired]:
    """The path every grant takes (arguments checked already). ``label``: the name the
    observer sees for a single limiter (a shard reports as its sharded limiter); ``first``:
    the limiters' answers to an attempt already made (``RateLimiter.try_acquire`` makes it
    itself when it can answer at once, and comes here for the rest). (A coroutine function
    in all but name: without an observer, one frame fewer per call.)"""
    if observer is None:
        return _acquire(limiters, permits, max_wait, None, (), first)
    return _observed(limiters, permits, max_wait, observer, label, first)


async def _observed(
    limiters: Sequence[RateLimiter],
    permits: Sequence[int],
    max_wait: int | None,
    observer: Observer,
    label: str | None,
    first: list[Attempt] | None,
) -> Acquired:
    names = [label or limiter.name for limiter in limiters]
    try:
        acquired = await _acquire(limiters, permits, max_wait, observer, names, first)
    except LimiterError as exc:
        for name, count in zip(names, permits, strict=True):
            observer.failed(name, count, exc)
        raise
    for name, count in zip(names, permits, strict=True):
        if acquired.granted:
            observer.granted(name, count, acquired.waited)
        else:
            observer.refused(name, count)
    return acquired


async def _acquire(
    limiters: Sequence[RateLimiter],
    permits: Sequence[int],
    max_wait: int | None,
    observer: Observer | None,
    names: Sequence[str],
    first: list[Attempt] | None,
) -> Acquired:
    loop = asyncio.get_running_loop()
    began = loop.time()
    waited = 0.0  # (granted at once: 0.0, not the round trip)
    while True:
        if first is not None:
            attempts, first = first, None
        elif len(limiters) == 1:
            attempt = await attempt_one(limiters[0], permits[0], max_wait)
            if attempt.__class__ is Grant and attempt.starts_in <= 0:  # the common case
                return Acquired(limiters, permits, (attempt,), waited)
            attempts = [attempt]
        else:
            attempts = await _attempt_all(limiters, permits, max_wait)
        grants = _grants(limiters, attempts)
        if len(grants) < len(attempts):  # one refused: nothing is taken
            await _release(grants)
            return Acquired(limiters, permits, attempts, 0.0)
        starts_in = 0
        for _, grant in grants:  # (the latest start: a loop, no generator to make)
            if grant.starts_in > starts_in:
                starts_in = grant.starts_in
        if starts_in <= 0:
            return Acquired(limiters, permits, attempts, waited)
        await _sleep_out(grants, starts_in, observer, names)
        waited = loop.time() - began
        if not await _blocked_meanwhile(grants):
            return Acquired(limiters, permits, attempts, waited)
        await _release(grants)  # behind the block: ask again
        if max_wait is not None:
            max_wait = max(max_wait - starts_in, 0)


async def attempt_one(limiter: RateLimiter, permits: int, max_wait: int | None) -> Attempt:
    """One limiter's attempt, through its breaker (Breaker.guard written out: one coroutine
    fewer per call)."""
    breaker = limiter._breaker
    try:
        breaker.enter()
    except BackendError:
        # Failing fast still yields: else a caller retrying at once in a loop would hold
        # the event loop for the whole back-off.
        await asyncio.sleep(0)
        raise
    try:
        attempt = await limiter._backend.try_acquire(limiter._name, permits, max_wait)
    except BackendError as exc:
        breaker.failed(exc)
        raise
    except BaseException:
        breaker.left()
        raise
    breaker.answered()
    return attempt


async def _attempt_all(
    limiters: Sequence[RateLimiter], permits: Sequence[int], max_wait: int | None
) -> list[Attempt]:
    """One attempt per limiter (two or more), every request made before any answer is
    awaited (on Redis they go in one round trip), without a task each
    (``Backend.start_acquire``); if any fails, the others' grants go back and the first error
    is raised. Calls fail at once while a limiter's breaker is open; each breaker is charged
    with its own limiters' answers alone (:func:`charge`). If this task is cancelled
    meanwhile, the attempts not yet answered are cancelled (their grants go back), and so are
    grants made."""
    try:
        breakers = enter_all([limiter._breaker for limiter in limiters])
    except BackendError:
        await asyncio.sleep(0)  # failing fast still yields, as in attempt_one
        raise
    started: list[Started | Exception] = []
    outcomes: list[Attempt | Exception] = []
    try:
        for limiter, count in zip(limiters, permits, strict=True):
            try:
                started.append(limiter._backend.start_acquire(limiter._name, count, max_wait))
            except Exception as exc:
                started.append(exc)
        for attempt in started:
            try:
                outcomes.append(attempt if isinstance(attempt, Exception) else await attempt)
            except Exception as exc:
                outcomes.append(exc)
    except BaseException:  # this task cancelled meanwhile
        for attempt in started[len(outcomes) :]:
            if not isinstance(attempt, Exception):
                attempt.cancel()
        for limiter, outcome in zip(limiters, outcomes, strict=False):
            if isinstance(outcome, Grant):
                limiter._backend.hand_back(limiter._name, outcome.member)
        for breaker in breakers:
            breaker.left()
        raise
    failures = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
    if failures:
        try:
            await _release(_grants(limiters, outcomes))
        finally:
            charge([limiter._breaker for limiter in limiters], outcomes)
        raise failures[0]
    for breaker in breakers:
        breaker.answered()
    return cast("list[Attempt]", outcomes)


def _grants(
    limiters: Sequence[RateLimiter], attempts: Sequence[object]
) -> list[tuple[RateLimiter, Grant]]:
    return [
        (limiter, attempt)
        for limiter, attempt in zip(limiters, attempts, strict=True)
        if isinstance(attempt, Grant)
    ]


async def _release(grants: Sequence[tuple[RateLimiter, Grant]]) -> None:
    """Hands back exactly these grants, each by its member (a refusal elsewhere, a block)."""
    if not grants:
        return
    releases = asyncio.gather(
        *(
            limiter._backend.release(limiter._name, parse_grant(grant.member)[0], grant.member)
            for limiter, grant in grants
        ),
        return_exceptions=True,
    )
    outcomes = await asyncio.shield(releases)  # a caller cancelled meanwhile: they go on
    failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    for outcome in failures:
        if not isinstance(outcome, Exception):
            raise outcome
    if failures:
        hand_backs_failed(failures[0], len(failures))  # one warning with the count, soon


async def _sleep_out(
    grants: Sequence[tuple[RateLimiter, Grant]],
    starts_in: int,
    observer: Observer | None,
    names: Sequence[str],
) -> None:
    """Sleeps until the last reserved grant starts, on the limiter's clock mapped to the
    loop's (``_wakeup``: never early, and no later than ``starts_in`` from now); a cancelled
    sleeper hands its grants back. The observer sees each limiter's caller waiting
    meanwhile, and how late it woke."""
    loop = asyncio.get_running_loop()
    now = loop.time()
    wake = now + starts_in / 1e6
    mapped = -math.inf
    for limiter, grant in grants:
        if grant.starts_in > 0:
            clock_map = limiter._backend.clock_map
            clock_map.observe(grant.starts_at - grant.starts_in, now)
            local = clock_map.local(grant.starts_at)
            mapped = max(mapped, wake if local is None else local)
    wake = min(wake, mapped)
    if observer is not None:
        for name in names:
            observer.queued(name, 1)
    try:
        await asyncio.sleep(max(wake - now, 0.0))
        if observer is not None:
            late = loop.time() - wake
            for name in names:
                observer.late(name, late)
    except asyncio.CancelledError:
        for limiter, grant in grants:
            limiter._backend.hand_back(limiter._name, grant.member)
        raise
    finally:
        if observer is not None:
            for name in names:
                observer.queued(name, -1)


async def _blocked_meanwhile(grants: Sequence[tuple[RateLimiter, Grant]]) -> bool:
    """After sleeping out reservations: whether a ``block()`` (from any process) came on a
    limiter whose grant was a reservation (a block ending after the grant's start); one read
    each, sent together."""
    reserved = [(limiter, grant) for limiter, grant in grants if grant.starts_in > 0]
    try:
        ends = await asyncio.gather(
            *(limiter._backend.blocked_until(limiter._name) for limiter, _ in reserved)
        )
    except BaseException:  # unknown: the grants go back rather than risk passing a block
        for limiter, grant in grants:
            limiter._backend.hand_back(limiter._name, grant.member)
        raise
    return any(
        end is not None and end > grant.starts_at
        for end, (_, grant) in zip(ends, reserved, strict=True)
    )
