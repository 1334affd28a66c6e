"""Fixed windows (fixed_window.lua, step for step): per rate the end of the latest window
holding grants (``a``; windows are aligned to multiples of the interval since the epoch, so
its end says which it is under any interval) and the permits in it (``b``)."""

from __future__ import annotations

from ..._types import Rate
from ._counters import Counters


def window_of(end: int, interval: int) -> int:
    """The number of the window ending at ``end`` (-1: none yet)."""
    return (end - 1) // interval


class FixedWindow(Counters):
    __slots__ = ()

    def rate_left(self, rate: Rate, a: int, b: int, now: int) -> int:
        window, current = window_of(a, rate.interval_us), now // rate.interval_us
        return rate.permits if window < current else rate.permits - b if window == current else 0

    def rate_start(self, rate: Rate, a: int, b: int, permits: int, now: int) -> int:
        window = window_of(a, rate.interval_us)
        if window < now // rate.interval_us:
            return now
        if b + permits <= rate.permits:
            return window * rate.interval_us
        return (window + 1) * rate.interval_us

    def rate_take(self, rate: Rate, a: int, b: int, permits: int, start: int) -> tuple[int, int]:
        window = start // rate.interval_us
        held = b + permits if window == window_of(a, rate.interval_us) else permits
        return (window + 1) * rate.interval_us, held

    def rate_tag(self, rate: Rate, a: int, b: int, permits: int, start: int) -> int:
        return b - permits  # the permits its window held before it

    def rate_until(self, rate: Rate, a: int, b: int) -> int:
        return (window_of(a, rate.interval_us) + 1) * rate.interval_us

    def rate_release(
        self, rate: Rate, a: int, b: int, wanted: int, start: int | None, now: int
    ) -> tuple[int, int, int]:
        # Only the latest window's count is kept: a grant there (or, without a member, in the
        # current window when nothing is reserved ahead) can go back.
        window = window_of(a, rate.interval_us)
        if start is None:
            start = now
        if start // rate.interval_us != window:
            return 0, a, b
        count = min(wanted, b)
        return count, a, b - count
