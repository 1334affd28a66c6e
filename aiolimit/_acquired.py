"""What the engine (``_acquire``) gives back: :class:`Outcome`, what asking the limiters got,
and :class:`Acquired`, the caller's result, built from it once and never patched.

>>> outcome = await ask(request)                  # the rate limiters' answers, slept out
>>> outcome.answer_of(tokens)                     # a Grant, a Refusal, or None
>>> acquired = Acquired(outcome.limiters, request.permits, outcome.attempts,
...                     seconds(outcome.waited), request.owners or request.limiters)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ._attempts import grants_of, release_grants
from ._checks import check_sync
from ._pacing import kept, refunded
from ._request import seconds
from ._settling import NOTHING, Limited, check_settle_permits, index_of, settle_grant
from ._values import Duration
from .backends._protocol import parse_grant
from .backends.base import Attempt, Grant, Refusal, Settlement

__all__ = ["Acquired", "Outcome"]


class Outcome:
    """What asking the rate limiters of a request got: each one's last answer, in the order
    asked (``limiters``: a shard, for a sharded limiter), and the µs slept for reservations
    (``waited``)."""

    __slots__ = ("attempts", "limiters", "waited")

    def __init__(
        self, limiters: tuple[Limited, ...], attempts: Sequence[Attempt], waited: int
    ) -> None:
        self.limiters = limiters
        self.attempts = tuple(attempts)
        self.waited = waited

    @property
    def granted(self) -> bool:
        """Whether every limiter granted."""
        return _all_granted(self.attempts)

    @property
    def retry_in(self) -> int:
        """µs until every refusing limiter could grant (0 when granted)."""
        return _retry_in(self.attempts)

    def answer_of(self, limiter: Limited) -> Attempt | None:
        """``limiter``'s answer (None: it was not asked)."""
        for each, attempt in zip(self.limiters, self.attempts, strict=True):
            if each is limiter:
                return attempt
        return None


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
        limiters: tuple[Limited, ...],
        permits: tuple[int, ...],
        attempts: tuple[Attempt, ...],
        waited: float,
        owners: tuple[Limited, ...],
    ) -> None:
        self.limiters = limiters
        self.permits = permits
        self.attempts = attempts
        self.waited = waited
        self.owners = owners
        self._released = False
        self._settles: dict[int, asyncio.Future[Settlement]] | None = None

    @property
    def granted(self) -> bool:
        return _all_granted(self.attempts)

    def __bool__(self) -> bool:
        return self.granted

    @property
    def retry_after(self) -> float:
        return seconds(_retry_in(self.attempts))

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
            grants = grants_of(self.limiters, self.attempts)
            await release_grants(grants)
            for limiter, grant in grants:  # (this process's callers waiting may have them now)
                refunded(limiter, parse_grant(grant.member)[0])

    async def settle(
        self,
        permits: int,
        *,
        limiter: object | None = None,
        cap: tuple[int, Duration] | None = None,
    ) -> Settlement:
        """The grant of ``limiter`` (may be omitted when this acquisition holds one) counts
        as ``permits`` from now on instead of what was reserved: fewer hand the difference
        back, more charge it now, into debt down to the limiter's ``max_debt`` (past it, the
        charge is ``cut``: logged and observed, not raised). Once per limiter: settling again
        returns the first result; a refused or released acquisition settles nothing
        (``Settlement(0, 0, "")``), and so does a limiter whose state is gone. A later
        :meth:`release` hands back what the grant holds now. A caller cancelled meanwhile
        does not stop it: the settle goes on, and settling again returns its result.
        ``cap=(remaining, reset)``: then, in the same call to the store, what the limiter
        has left is capped at a provider's count, as :meth:`RateLimiter.cap_remaining` caps
        it (the count its response carried, which counts this call already)."""
        permits = check_settle_permits(permits)
        floor = None if cap is None else check_sync(*cap)
        i = index_of(self.limiters, self.owners, limiter)
        settles = self._settles
        if settles is None:
            settles = self._settles = {}
        settling = settles.get(i)
        if settling is None:
            if self._released or not self.granted:
                return NOTHING
            settling = settles[i] = asyncio.ensure_future(self._settle(i, permits, floor))
        return await asyncio.shield(settling)

    async def _settle(self, i: int, permits: int, floor: tuple[int, int] | None) -> Settlement:
        grant = self.attempts[i]
        assert isinstance(grant, Grant)
        try:
            limiter = self.limiters[i]
            settled, grant = await settle_grant(
                limiter, grant, permits, self.owners[i].name, floor, kept(limiter)
            )
        except BaseException:
            if self._settles is not None:
                del self._settles[i]  # not settled: may be tried again
            raise
        self.attempts = (*self.attempts[:i], grant, *self.attempts[i + 1 :])
        if settled.handed_back:  # this process's callers waiting may have them now
            refunded(self.limiters[i], settled.handed_back)
        return settled


def _all_granted(attempts: Sequence[Attempt]) -> bool:
    for attempt in attempts:  # noqa: SIM110 (a loop: no generator to make)
        if not isinstance(attempt, Grant):
            return False
    return True


def _retry_in(attempts: Sequence[Attempt]) -> int:
    """µs until every refusing limiter could grant (0 when all granted)."""
    return max((a.retry_in for a in attempts if isinstance(a, Refusal)), default=0)
