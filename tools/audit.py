"""The audits: what the grants the callers recorded say about each bound a limiter promises.

The sliding window (at most ``rate`` permits in any window of ``interval``) is
:func:`busiest_window`, which ``aiolimit demo`` uses too and so ships with the package
(``aiolimit/_tools/window.py``): it trusts nothing the limiter stores, only the stamps the
callers took.

The other promises, over grant times alone (a time, or ``(time, permits)``):

* :func:`busiest_fixed_window`: the most permits in one window aligned to multiples of
  ``interval`` (on the clock the times were read from);
* :func:`fullest_bucket`: a token bucket of ``rate`` tokens refilled at ``rate / interval``,
  starting full, grants at most ``rate + rate * w / interval`` permits in any span of length
  w. It finds, exactly, the largest ``permits in [t_i, t_j] - rate * (t_j - t_i) / interval``
  over every pair of grants i <= j (O(n log n));
* :func:`closest_grants`: the least gap between the starts of consecutive grants, against a
  minimum spacing.

>>> busiest_fixed_window([0, 999, 1000, 1500, 1999], 1000, rate=2)   # windows [0, 1000), ...
Window(most=3, over=1, end=1999)
>>> fullest_bucket([0, 0, 500, 1000], 2, 1000)          # 2 at once, then one per 500
Bucket(peak=2.0, over=0, start=0, end=0)
>>> fullest_bucket([0, 0, 500, 600], 2, 1000)           # 4 in [0, 600]: 2 + 1.2 allowed
Bucket(peak=2.8, over=1, start=0, end=600)
>>> closest_grants([0, 200, 350], 200)
Spacing(closest=150, too_close=1, at=350)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from aiolimit._tools.window import Stamp, Window, busiest_window

__all__ = [
    "Bucket",
    "Spacing",
    "Stamp",
    "Window",
    "busiest_fixed_window",
    "busiest_window",
    "closest_grants",
    "fullest_bucket",
]

Timed = float | tuple[float, int]
"""A grant's time, optionally with its permits (default 1)."""


def busiest_fixed_window(
    times: Iterable[Timed], interval: float, *, rate: int | None = None
) -> Window:
    """The most permits in one window ``[k * interval, (k + 1) * interval)`` over ``times``;
    with ``rate``, also how many windows held more than that. Whole-microsecond times and
    interval compare exactly, so no slack is needed. O(n)."""
    windows: dict[float, int] = {}
    newest: dict[float, float] = {}
    for time, permits in map(_timed, times):
        window = time // interval
        windows[window] = windows.get(window, 0) + permits
        newest[window] = max(newest.get(window, time), time)
    most, end = 0, 0.0
    for window, held in windows.items():
        if held > most or (held == most and newest[window] < end):
            most, end = held, newest[window]
    over = 0 if rate is None else sum(held > rate for held in windows.values())
    return Window(most, over, end)


@dataclass(frozen=True)
class Bucket:
    peak: float
    """The largest ``permits in [start, end] - rate * (end - start) / interval``: what a
    bucket starting full must have held for those grants. At most ``rate`` when kept."""
    over: int = 0
    """Grant times that end a span over the bound, one per distinct time."""
    start: float = 0.0
    """Where the worst span starts."""
    end: float = 0.0
    """Where it ends."""


def fullest_bucket(
    times: Iterable[Timed], rate: int, interval: float, *, slack: float = 0.0
) -> Bucket:
    """Checks a token bucket of ``rate`` tokens refilled at ``rate / interval`` over every
    pair of grants i <= j: the permits granted in ``[t_i, t_j]`` may be at most ``rate + rate
    * (t_j - t_i + slack) / interval``. O(n log n).

    With S the running sum of permits in time order, the permits in ``[t_i, t_j]`` are
    ``S_j - S_(i-1)``, so the worst span ending at j is found from the least ``interval *
    S_(i-1) - rate * t_i`` over i <= j, kept as one running minimum. The comparison is made
    on ``interval * permits - rate * span``: exact for whole-microsecond times and interval.
    """
    grants = sorted(map(_timed, times))
    before = 0  # permits of the grants before this one
    least: float | None = None  # the least interval * S_(i-1) - rate * t_i so far
    least_at = 0.0
    worst: float | None = None
    start = end = 0.0
    over = 0
    for index, (time, permits) in enumerate(grants):
        candidate = interval * before - rate * time
        if least is None or candidate < least:
            least, least_at = candidate, time
        before += permits
        # Grants at the same instant: only the last of them closes the full span.
        if index + 1 < len(grants) and grants[index + 1][0] == time:
            continue
        excess = interval * before - rate * time - least  # interval * permits - rate * span
        if worst is None or excess > worst:
            worst, start, end = excess, least_at, time
        if excess - rate * slack > rate * interval:
            over += 1
    return Bucket(0.0 if worst is None else worst / interval, over, start, end)


@dataclass(frozen=True)
class Spacing:
    closest: float | None
    """The least gap between the starts of consecutive grants (None: fewer than two)."""
    too_close: int = 0
    """Consecutive grants closer than the spacing (less ``slack``)."""
    at: float = 0.0
    """The later grant of the closest pair."""


def closest_grants(times: Iterable[Timed], spacing: float, *, slack: float = 0.0) -> Spacing:
    """The least gap between consecutive grant times, and how many gaps are shorter than
    ``spacing - slack`` (two grants at one instant are a gap of 0). O(n log n)."""
    ordered = sorted(time for time, _ in map(_timed, times))
    closest: float | None = None
    at = 0.0
    too_close = 0
    for earlier, later in itertools.pairwise(ordered):
        gap = later - earlier
        if closest is None or gap < closest:
            closest, at = gap, later
        if gap < spacing - slack:
            too_close += 1
    return Spacing(closest, too_close, at)


def _timed(stamp: Timed) -> tuple[float, int]:
    """(time, permits)."""
    return (stamp, 1) if not isinstance(stamp, tuple) else stamp
