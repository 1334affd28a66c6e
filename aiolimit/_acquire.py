"""The engine: every way of taking permits comes through here, once.

>>> acquired = await acquire([everyone, per_user], [1, 1], max_wait, observer)
>>> if not acquired:
...     raise TooBusy(retry_after=acquired.retry_after)

One attempt per limiter, all sent together (one round trip on Redis: the backend's coalescer
batches them), all or nothing: when one refuses, the others' grants go back, each by its
member. When every limiter grants, reservations are slept out on the event loop's timer; a
limiter that was blocked meanwhile (``block()`` from any process) moves the whole request
behind its block. Each limiter is reported to the observer. After the store failed, calls
fail at once for a short, growing back-off (:class:`~aiolimit.Breaker`) while one call
probes.

A leaf: it knows a limiter only as :class:`Limited` (a name, a backend, a breaker, the rate
its code gives: written again when the store lost it), and imports nothing of the limiters
and surfaces above it; their arguments are checked there (``_checks``). It asks the store
through ``_attempts``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any

from . import _observe
from ._attempts import ask, attempt_all, attempt_one, grants_of, release_grants
from ._observe import Observer
from ._settling import (
    NOTHING,
    Limited,
    check_settle_permits,
    index_of,
    settle_grant,
)
from ._wakeup import sleep_out
from .backends.base import Attempt, Grant, Refusal, Settlement
from .errors import BackendError, LimiterError, NotConfiguredError

__all__ = [
    "Acquired",
    "Limited",
    "acquire",
    "acquire_unreported",
    "give_back",
    "observed",
    "try_one",
]


class Acquired:
    """What :func:`aiolimit.acquire_all` did: true when every limiter granted.

    ``attempts`` holds the last answer of each limiter, in the order asked (a refusal's
    ``retry_in`` says when that limiter could grant); ``waited`` the seconds slept for
    reservations; ``retry_after`` the seconds until every refusing limiter could grant (0.0
    when granted). :meth:`release` hands back exactly these grants; :meth:`settle` says what
    one of them really cost. ``owners``: the limiters as the caller knows them (a
    ``ShardedRateLimiter`` for the shard that granted).
    """

    __slots__ = ("_released", "_settles", "attempts", "limiters", "owners", "permits", "waited")

    def __init__(
        self,
        limiters: Sequence[Limited],
        permits: Sequence[int],
        attempts: Sequence[Attempt],
        waited: float,
    ) -> None:
        self.limiters = tuple(limiters)
        self.permits = tuple(permits)
        self.attempts = tuple(attempts)
        self.waited = waited
        self.owners: tuple[Limited, ...] = self.limiters
        self._released = False
        self._settles: dict[int, asyncio.Future[Settlement]] | None = None

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
            if self._settles:  # what a settle under way leaves is what goes back
                await asyncio.gather(*self._settles.values(), return_exceptions=True)
            await release_grants(grants_of(self.limiters, self.attempts))

    async def settle(self, permits: int, *, limiter: object | None = None) -> Settlement:
        """The grant of ``limiter`` (may be omitted when this acquisition holds one) counts
        as ``permits`` from now on instead of what was reserved: fewer hand the difference
        back, more charge it now, into debt down to the limiter's ``max_debt`` (past it, the
        charge is ``cut``: logged and observed, not raised). Once per limiter: settling again
        returns the first result; a refused or released acquisition settles nothing
        (``Settlement(0, 0, "")``), and so does a limiter whose state is gone. A later
        :meth:`release` hands back what the grant holds now. A caller cancelled meanwhile
        does not stop it: the settle goes on, and settling again returns its result."""
        permits = check_settle_permits(permits)
        i = index_of(self.limiters, self.owners, limiter)
        settles = self._settles
        if settles is None:
            settles = self._settles = {}
        settling = settles.get(i)
        if settling is None:
            if self._released or not self.granted:
                return NOTHING
            settling = settles[i] = asyncio.ensure_future(self._settle(i, permits))
        return await asyncio.shield(settling)

    async def _settle(self, i: int, permits: int) -> Settlement:
        grant = self.attempts[i]
        assert isinstance(grant, Grant)
        try:
            settled, grant = await settle_grant(
                self.limiters[i], grant, permits, self.owners[i].name
            )
        except BaseException:
            if self._settles is not None:
                del self._settles[i]  # not settled: may be tried again
            raise
        self.attempts = (*self.attempts[:i], grant, *self.attempts[i + 1 :])
        return settled


async def try_one(limiter: Limited, permits: int, max_wait: int | None) -> bool:
    """Whether one limiter grants ``permits`` within ``max_wait`` µs (None: any wait): the
    path of ``RateLimiter.try_acquire``, and the fast one. Without an observer, a grant at
    once or a refusal is decided in this frame (the breaker's guard written out, as in
    ``attempt_one``: one coroutine fewer per call); a reservation is slept out as
    :func:`acquire` does."""
    if _observe.current is not None:
        return (await acquire([limiter], [permits], max_wait, _observe.current)).granted
    breaker = limiter.breaker
    try:
        breaker.enter()
    except BackendError:
        await asyncio.sleep(0)  # failing fast still yields, as in attempt_one
        raise
    try:
        attempt = await limiter.backend.try_acquire(limiter.name, permits, max_wait)
    except BackendError as exc:
        breaker.failed(exc)
        raise
    except NotConfiguredError as lost:
        breaker.left()
        attempts = await ask([limiter], [permits], max_wait, lost)
        return (await _settle([limiter], [permits], attempts, max_wait, None, ())).granted
    except BaseException:
        breaker.left()
        raise
    breaker.answered()
    if not isinstance(attempt, Grant):
        return False
    if attempt.starts_in <= 0:
        return True
    acquired = await _settle([limiter], [permits], [attempt], max_wait, None, ())
    return acquired.granted


# Its coroutine is what RateLimiter.try_acquire returns: a caller that forgets to await it
# is warned of the method it called (set once here, not on each call: the hot path).
try_one.__qualname__ = "RateLimiter.try_acquire"


def acquire(
    limiters: Sequence[Limited],
    permits: Sequence[int],
    max_wait: int | None,
    observer: Observer | None,
    label: str | None = None,
) -> Coroutine[Any, Any, Acquired]:
    """The path every grant takes (arguments checked already), reported to the observer.
    ``label``: the name the observer sees for a single limiter. (A coroutine function in all
    but name: without an observer, one frame fewer per call.)"""
    if observer is None:
        return _acquire(limiters, permits, max_wait, None, ())
    names = [label or limiter.name for limiter in limiters]
    acquiring = _acquire(limiters, permits, max_wait, observer, names)
    return observed(acquiring, names, permits, observer)


def acquire_unreported(
    limiter: Limited, permits: int, max_wait: int | None, observer: Observer | None, label: str
) -> Coroutine[Any, Any, Acquired]:
    """:func:`acquire` for one limiter, its outcome not reported: the observer sees only its
    caller queued, as ``label``. For a caller whose own outcome is reported through
    :func:`observed` (a sharded limiter waiting on one shard)."""
    return _acquire([limiter], [permits], max_wait, observer, [label])


async def observed(
    acquiring: Coroutine[Any, Any, Acquired],
    names: Sequence[str],
    permits: Sequence[int],
    observer: Observer,
) -> Acquired:
    """What ``acquiring`` gives, reported to ``observer`` under ``names``: granted (with the
    seconds waited), refused, or failed (the error)."""
    try:
        acquired = await acquiring
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


async def give_back(limiter: Limited, permits: int) -> int:
    """Hands back ``permits`` of ``limiter``'s most recent grants, through its breaker;
    returns how many were."""
    return await limiter.breaker.guard(limiter.backend.release(limiter.name, permits))


async def _acquire(
    limiters: Sequence[Limited],
    permits: Sequence[int],
    max_wait: int | None,
    observer: Observer | None,
    names: Sequence[str],
) -> Acquired:
    try:
        if len(limiters) == 1:
            attempt = await attempt_one(limiters[0], permits[0], max_wait)
            if attempt.__class__ is Grant and attempt.starts_in <= 0:  # the common case
                return Acquired(limiters, permits, (attempt,), 0.0)
            attempts = [attempt]
        else:
            attempts = await attempt_all(limiters, permits, max_wait)
    except NotConfiguredError as lost:
        attempts = await ask(limiters, permits, max_wait, lost)
    return await _settle(limiters, permits, attempts, max_wait, observer, names)


async def _settle(
    limiters: Sequence[Limited],
    permits: Sequence[int],
    attempts: list[Attempt],
    max_wait: int | None,
    observer: Observer | None,
    names: Sequence[str],
) -> Acquired:
    """After the limiters' first answers: a refusal hands the others' grants back; grants
    that are reservations are slept out, and asked again behind a block that came
    meanwhile."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    waited = 0.0  # (granted at once: 0.0, not the round trip)
    while True:
        grants = grants_of(limiters, attempts)
        if len(grants) < len(attempts):  # one refused: nothing is taken
            await release_grants(grants)
            return Acquired(limiters, permits, attempts, 0.0)
        starts_in = 0
        for _, grant in grants:  # (the latest start: a loop, no generator to make)
            if grant.starts_in > starts_in:
                starts_in = grant.starts_in
        if starts_in <= 0:
            return Acquired(limiters, permits, attempts, waited)
        blocked = await sleep_out(grants, starts_in, observer, names)
        waited = loop.time() - began
        if not blocked:
            return Acquired(limiters, permits, attempts, waited)
        await release_grants(grants)  # behind the block: ask again
        if max_wait is not None:
            max_wait = max(max_wait - starts_in, 0)
        attempts = await ask(limiters, permits, max_wait)
