"""What the soak knows of each algorithm, in one table (``BOUNDS``): the most permits any one
interval may hold, its own exact check on the limiter's clock, the permits it allows a fresh
budget in a span, and when a waiter's permits were free. ``limits`` and ``audit`` ask it, and
adding an algorithm adds its row (the rules are in :mod:`tools.soak.audit`'s docstring)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiolimit import Algorithm, Rate

from ..audit import Window, busiest_fixed_window, fullest_bucket

if TYPE_CHECKING:
    from .worker import Grant

__all__ = ["BOUNDS", "TOLERANCE_US", "Bounds"]

TOLERANCE_US = 1
"""Rounding the token-bucket and spacing checks allow (grant times are whole microseconds)."""

Timed = Sequence[tuple[int, int]]
"""One budget's grants as (limiter time, permits)."""


@dataclass(frozen=True)
class Bounds:
    """One algorithm's bounds, as the soak checks them."""

    check: str
    """What its own check is, as the report names it."""
    interval_bound: Callable[[Rate], int]
    """The most permits one interval (any, not aligned) of the rate may hold."""
    audit: Callable[[Timed, Rate, Window], tuple[float, int]]
    """Its own check of one budget: (the worst figure, the spans over the bound), given the
    busiest interval at ``interval_bound`` (the sliding window's own check)."""
    allowed: Callable[[Rate, float, float], int]
    """The most permits the rate lets a fresh budget take in ``[first, last)`` (limiter us)."""
    free: Callable[[Sequence[Grant], Rate, Sequence[float]], list[float]]
    """For each grant (in limiter time order, with its request's limiter time): from when
    the rate had room for its permits, counting only the grants before it."""


def _free_in_sliding_window(
    ordered: Sequence[Grant], rate: Rate, requested: Sequence[float]
) -> list[float]:
    """Walk back from g summing permits; the grant that leaves no room for g's permits frees
    them when it leaves the window."""
    result = []
    for index, grant in enumerate(ordered):
        free = -math.inf
        taken = 0
        for k in range(index - 1, -1, -1):
            earlier = ordered[k]
            taken += earlier.permits
            if taken > rate.permits - grant.permits:
                free = earlier.limiter_time + rate.interval_us
                break
        result.append(free)
    return result


def _free_in_bucket(
    ordered: Sequence[Grant], rate: Rate, requested: Sequence[float]
) -> list[float]:
    """Replays the bucket (GCRA: the time it is full again) over the grants in order: g's
    permits were there from ``full - interval + their refill``."""
    per_permit = rate.interval_us / rate.permits
    full = -math.inf
    result = []
    for grant in ordered:
        cost = grant.permits * per_permit
        result.append(full + cost - rate.interval_us)
        full = max(full, grant.limiter_time) + cost
    return result


def _free_in_fixed_windows(
    ordered: Sequence[Grant], rate: Rate, requested: Sequence[float]
) -> list[float]:
    """g's window had room for g from its start; so had each window before it whose grants
    (all of them: a window's count only grows) left room for g's permits."""
    interval = rate.interval_us
    totals: Counter[int] = Counter()
    for grant in ordered:
        totals[grant.limiter_time // interval] += grant.permits
    result = []
    for grant, asked in zip(ordered, requested, strict=True):
        window = grant.limiter_time // interval
        while window * interval > asked and totals[window - 1] <= rate.permits - grant.permits:
            window -= 1
        result.append(float(window * interval))
    return result


def _in_any_window(timed: Timed, rate: Rate, busiest: Window) -> tuple[float, int]:
    return busiest.most, busiest.over


def _in_aligned_windows(timed: Timed, rate: Rate, busiest: Window) -> tuple[float, int]:
    aligned = busiest_fixed_window(timed, rate.interval_us, rate=rate.permits)
    return aligned.most, aligned.over


def _in_bucket(timed: Timed, rate: Rate, busiest: Window) -> tuple[float, int]:
    bucket = fullest_bucket(timed, rate.permits, rate.interval_us, slack=TOLERANCE_US)
    return bucket.peak, bucket.over


def _windows_touched(rate: Rate, first: float, last: float) -> int:
    interval = rate.interval_us
    windows = math.floor((last - 1) / interval) - math.floor(first / interval) + 1
    return rate.permits * max(1, windows)


BOUNDS: dict[Algorithm, Bounds] = {
    Algorithm.SLIDING_WINDOW: Bounds(
        check="any window",
        interval_bound=lambda rate: rate.permits,
        audit=_in_any_window,
        allowed=lambda rate, first, last: (
            rate.permits * math.ceil((last - first) / rate.interval_us - 1e-9)
        ),
        free=_free_in_sliding_window,
    ),
    Algorithm.FIXED_WINDOW: Bounds(
        check="aligned window",
        interval_bound=lambda rate: 2 * rate.permits,  # the boundary burst
        audit=_in_aligned_windows,
        allowed=_windows_touched,
        free=_free_in_fixed_windows,
    ),
    Algorithm.TOKEN_BUCKET: Bounds(
        check="bucket",
        interval_bound=lambda rate: 2 * rate.permits - 1,
        audit=_in_bucket,
        allowed=lambda rate, first, last: math.floor(
            rate.permits + rate.permits * (last - first) / rate.interval_us + 1e-9
        ),
        free=_free_in_bucket,
    ),
}
