"""What a caller asks of the engine (``_acquire``): one :class:`Request` value, and the one unit
its time is counted in, integer microseconds on the event loop's clock.

>>> request = Request((everyone, per_user), (1, 1), deadline_in(max_wait))
>>> acquired = await take(request)

A deadline is a point on the loop's clock, not a wait: every step of an acquisition (slots,
then rate permits, asked again behind a block, a metered call asking a short way ahead) asks
with what is left of it (:func:`left_of`), with no seconds in between. This module is the
one place the engine turns microseconds into seconds (:func:`seconds`: a sleep, a public
attribute) and back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from ._settling import Limited
from ._values import US, Duration, seconds
from ._values import micros_up as micros

if TYPE_CHECKING:
    from ._lease import Lease

__all__ = ["Leasing", "Request", "deadline_in", "left_of", "micros", "now_us", "seconds"]


def now_us() -> int:
    """The event loop's clock, in µs."""
    return int(asyncio.get_running_loop().time() * US)


def deadline_in(max_wait: int | None) -> int | None:
    """The loop-clock µs at which a wait of ``max_wait`` µs from now ends (None: no end)."""
    return None if max_wait is None else now_us() + max_wait


def left_of(deadline: int | None) -> int | None:
    """The µs left until ``deadline`` (0 once it has passed; None: no end)."""
    return None if deadline is None else max(deadline - now_us(), 0)


class Leasing(Protocol):
    """What an acquisition needs of a concurrency limiter."""

    @property
    def name(self) -> str: ...

    async def try_lease(
        self, permits: int = 1, *, timeout: Duration | None = 0
    ) -> Lease | None: ...


@dataclass(frozen=True, slots=True)
class Request:
    """One acquisition, as the engine takes it: ``permits[i]`` of ``limiters[i]``, all or
    nothing, within ``deadline``; the ``slots`` of concurrency limiters first, in that order.
    Arguments are checked before one is made (``_checks``)."""

    limiters: tuple[Limited, ...]
    """The rate limiters, as the caller knows them (a ``ShardedRateLimiter`` picks a shard)."""
    permits: tuple[int, ...]
    """How many of each."""
    deadline: int | None
    """When the caller stops waiting, in µs on the loop's clock (None: never)."""
    slots: tuple[tuple[Leasing, int], ...] = ()
    """Concurrency limiters and their slots, taken first (in one order for every caller)."""
    owners: tuple[Limited, ...] = ()
    """Who each limiter is for, when not itself: the names the observer sees, the limiters an
    acquisition settles by (a shard's request is its sharded limiter's)."""
    paced: tuple[Limited, ...] = ()
    """Those of ``limiters`` whose grants the caller may settle for less: the request is
    asked in its process's turn and reserves no further ahead than ``_pacing.HORIZON`` (none:
    it reserves as far ahead as its deadline allows, in the store's FIFO order)."""

    def adding(self, more: Sequence[tuple[Limited, int]], *, paced: bool = False) -> Request:
        """The same request, with ``more`` (limiter, permits) taken with it (``paced``: as
        grants that will be settled)."""
        added = tuple(limiter for limiter, _ in more)
        return replace(
            self,
            limiters=(*self.limiters, *added),
            permits=(*self.permits, *(n for _, n in more)),
            paced=(*self.paced, *added) if paced else self.paced,
        )

    def settled(self) -> Request:
        """The same request, every limiter's grant one that will be settled (paced)."""
        return replace(self, paced=self.limiters)

    def until(self, deadline: int | None) -> Request:
        """The same request, asked with another deadline."""
        return replace(self, deadline=deadline)

    def names(self) -> list[str]:
        """The names the observer sees, one per limiter."""
        return [owner.name for owner in self.owners or self.limiters]
