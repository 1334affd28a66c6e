"""The busiest sliding window over the stamps callers took of their grants: the verdict of
``aiolimit demo``, and the sliding-window audit of the soak tool (``tools/audit.py``).

It trusts nothing the limiter stores, only the stamps:

>>> busiest_window([0.0, 0.5, 0.99, 1.0, 1.5], 1.0).most       # times: 0.5, 0.99 and 1.0
3
>>> busiest_window([(0.0, 0.1), (0.95, 1.2)], 1.0).most         # spans: never certainly together
1
>>> busiest_window([(0, 0, 2), (400, 400, 1)], 500, rate=2)     # with permits
Window(most=3, over=1, end=400)

A grant is stamped with a time, or with the span ``(earliest, latest)`` it certainly lies in
(a clock read before and after the call), optionally followed by its permits (default 1). A
set of grants counts as one window's when all their stamps fit in less than ``interval -
slack``: for times, the half-open window ``(t - interval, t]`` the limiter enforces; for
spans, only when the overfill is certain. ``slack`` absorbs what stamps cannot: microsecond
rounding, or the jitter of a stamp taken some way after its grant.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Stamp", "Window", "busiest_window"]

Stamp = float | tuple[float, float] | tuple[float, float, int]
"""A grant's time; or the span it lies in; or the span and the grant's permits."""


@dataclass(frozen=True)
class Window:
    most: int
    """The most permits inside one window."""
    over: int = 0
    """Windows holding more than ``rate`` permits, one per distinct end (0 without a rate)."""
    end: float = 0.0
    """Where the busiest window ends: the latest stamp of its newest grant."""


def busiest_window(
    stamps: Iterable[Stamp], interval: float, *, rate: int | None = None, slack: float = 0.0
) -> Window:
    """The busiest window of ``interval - slack`` over ``stamps`` (see the module docstring);
    with ``rate``, also how many windows held more than that. O(n log n)."""
    grants = sorted(_span(stamp) for stamp in stamps)  # by latest
    length = interval - slack
    inside: list[tuple[float, int]] = []  # (earliest, permits) of the grants in the window
    held = most = over = 0
    end = 0.0
    for index, (latest, earliest, permits) in enumerate(grants):
        heapq.heappush(inside, (earliest, permits))
        held += permits
        # Grants stamped at the same instant: only the last of them closes the full window.
        if index + 1 < len(grants) and grants[index + 1][0] == latest:
            continue
        # A grant that started before this window cannot be in any later one either.
        while inside and inside[0][0] <= latest - length:
            held -= heapq.heappop(inside)[1]
        if held > most:
            most, end = held, latest
        if rate is not None and held > rate:
            over += 1
    return Window(most, over, end)


def _span(stamp: Stamp) -> tuple[float, float, int]:
    """(latest, earliest, permits)."""
    if not isinstance(stamp, tuple):
        return stamp, stamp, 1
    if len(stamp) == 2:
        return stamp[1], stamp[0], 1
    return stamp[1], stamp[0], stamp[2]
