"""Where a limiter's clock stands on this process's: when a reservation starts here.

A grant's start is a time on the limiter's clock (Redis's ``TIME`` by default). Sleeping
``starts_in`` from the moment the reply is read wakes the caller late by however long the
reply took to reach it (the round trip back, the event loop's other work), and by a different
amount for each caller: a partner that counts arrivals in its own window then sees late ones
bunch with on-time ones. So each backend keeps a :class:`ClockMap` per clock its limiters
run on (:class:`ClockMaps`; ``Backend.clock_of`` says which): every reply says the
limiter's time when it was decided, which was no later than when this process read it, so
``limiter time - loop time`` at the read is a lower bound of the clocks' offset; the tightest
(largest) bound seen lately maps a start to the loop's clock, never early. (A reply read
after a long stall gives a loose bound, which the tighter ones of other replies replace.)
Clocks are mapped apart because they differ: under ``clock='client'`` each limiter's clock
is the latest time any client sent it (a host whose clock runs ahead pushes it ahead), and a
cluster's nodes each have their own ``TIME``; one map for all of them would wake the waiters
of one limiter early by another's lead.

Offsets are kept for :data:`KEPT_FOR` seconds at most (two buckets), so the map follows the
clocks' drift; a server clock stepped back (not slewed) by more than a round trip could wake
a caller early by the step until then.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

from .._values import seconds

__all__ = ["KEPT_FOR", "REMEMBERED", "ClockMap", "ClockMaps"]

KEPT_FOR = 30.0
"""Seconds an offset is trusted for (the map keeps the tightest of the last 15 to 30 s)."""
REMEMBERED = 4096
"""Clocks a backend keeps a map of: the least recently used is forgotten first (a clock
forgotten and seen again maps as at first, by its replies alone, never early)."""


class ClockMap:
    """The tightest offset lately seen between a limiter's clock (µs) and the loop's (s)."""

    __slots__ = ("_current", "_previous", "_since")

    def __init__(self) -> None:
        self._current = -math.inf  # the tightest bound of this bucket
        self._previous = -math.inf  # ... and of the one before it
        self._since = -math.inf  # the loop time this bucket began

    def observe(self, decided_at: int, read_at: float) -> None:
        """A reply decided at ``decided_at`` (µs, limiter's clock) was read at ``read_at``
        (loop time)."""
        if read_at - self._since >= KEPT_FOR / 2:
            self._previous, self._current, self._since = self._current, -math.inf, read_at
        offset = seconds(decided_at) - read_at
        if offset > self._current:
            self._current = offset

    def local(self, at: int) -> float | None:
        """The loop time at which the limiter's clock reads ``at`` (µs) at the earliest, by
        the tightest offset seen; None before any was seen."""
        offset = max(self._current, self._previous)
        if offset == -math.inf:
            return None
        return seconds(at) - offset


class ClockMaps(dict[Hashable, ClockMap]):
    """A :class:`ClockMap` per clock (a limiter's, a server's, a cluster node's), at most
    :data:`REMEMBERED` of them."""

    __slots__ = ()

    def of(self, source: Hashable) -> ClockMap:
        """The map of the clock ``source``, made when first asked for."""
        clock_map = self.pop(source, None)
        if clock_map is None:
            clock_map = ClockMap()
            if len(self) >= REMEMBERED:
                del self[next(iter(self))]
        self[source] = clock_map  # (the most recently used last)
        return clock_map
