"""Fixed windows (fixed_window.lua, step for step): per rate the end of the latest window
holding grants (``a``; windows are aligned to multiples of the interval since the epoch, so
its end says which it is under any interval) and the permits in it (``b``); besides, per
rate, up to ``HELD_BUCKETS`` earlier windows that held grants (``Budget.held``: ``[rate,
count, end]``, oldest first), which a longer interval counts in the window that covers them; and
a sync's floor past a window's end (``Budget.carried``: ``_carries.py``)."""

from __future__ import annotations

from dataclasses import replace

from ..._types import MAX_RATES, Rate, RateLimiterConfig
from .._protocol import HELD_BUCKETS
from ._carries import Carried, loaded
from ._held import kept_until
from ._state import Config, Limiter


def window_of(end: int, interval: int) -> int:
    """The number of the window ending at ``end`` (-1: none yet)."""
    return (end - 1) // interval


class FixedWindow(Carried):
    __slots__ = ()

    fixed_edges = True

    def rates_changed(self, limiter: Limiter, old: Config, now: int) -> bool:
        stored = limiter.config
        assert stored is not None
        if (
            self.state_in_config(self.config)
            and not self.fresh
            and windows_outlived(self, old.config.rates, now)
            and not self.carrying(now)
        ):
            self.fresh, stored.state = True, None  # forgotten, as an expired key
        return False

    def __init__(
        self, limiter: Limiter, config: RateLimiterConfig, key: str | None, write: bool
    ) -> None:
        super().__init__(limiter, config, key, write)
        # The earlier windows of rates the config still has; those that lie in a rate's
        # latest window (after set_rate to a longer interval) count in it (a copy, stored
        # only if saved, as in Counters).
        state, rates = self.state, config.rates
        n, held = list(state.n), []
        for i, count, end in state.held[: HELD_BUCKETS * MAX_RATES]:
            if i > len(rates):
                continue
            interval = rates[i - 1].interval_us
            if window_of(end, interval) == window_of(n[2 * i - 2], interval):
                n[2 * i - 1] += count
            else:
                held.append([i, count, end])
        carried = loaded(state.carried, rates)
        if held != state.held or carried != state.carried:
            self.state = replace(state, n=n, held=held, carried=carried)

    def commit(self, permits: int, start: int) -> str:
        # Keeps the windows the grant leaves behind: per rate at most HELD_BUCKETS.
        for i in range(len(self.config.rates)):
            self.synced(i, start + 1)
        return super().commit(permits, start)

    def synced(self, i: int, window_end: int) -> None:
        # Keeps the window rate i (from 0) leaves for the one ending at `window_end`, if it
        # held grants (fixed_window.lua's `hold_window`).
        n, held, interval = self.state.n, self.state.held, self.config.rates[i].interval_us
        end, count = n[2 * i], n[2 * i + 1]
        if count > 0 and (window_end - 1) // interval > window_of(end, interval):
            mine = [j for j, entry in enumerate(held) if entry[0] == i + 1]
            if len(mine) == HELD_BUCKETS:
                del held[mine[0]]
            held.append([i + 1, count, end])

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

    def rate_span(self, rate: Rate) -> int:
        return rate.permits

    def rate_ahead(self, rate: Rate, a: int, b: int, now: int) -> tuple[int, int]:
        start = window_of(a, rate.interval_us) * rate.interval_us
        if start > now:
            return b, start  # (a window that has not begun holds reservations alone)
        return 0, start

    def rate_until(self, rate: Rate, a: int, b: int, now: int) -> int:
        # Its window, then the rest of the summary's span, for a longer interval (held.lua).
        window, interval = window_of(a, rate.interval_us), rate.interval_us
        keep_alive = self.config.keep_alive_us or 0
        return kept_until(
            keep_alive, (window + 1) * interval, (window + 1 + HELD_BUCKETS) * interval, now
        )

    def rate_release(
        self, rate: Rate, a: int, b: int, wanted: int, start: int | None, now: int, held: int
    ) -> tuple[int, int, int]:
        # Only the latest window's count is kept: a grant there (or, without a member, in the
        # current window when nothing is reserved ahead) can go back.
        window = window_of(a, rate.interval_us)
        if start is None:
            start = now
        if start // rate.interval_us != window or window < now // rate.interval_us:
            return 0, a, b  # (another window's, or one that has ended)
        count = min(wanted, b)
        return count, a, b - count

    def rate_room(self, rate: Rate, a: int, b: int, now: int) -> int:
        # `left`, less the permits of the windows ahead (reservations, or a debt).
        window, current = window_of(a, rate.interval_us), now // rate.interval_us
        if window <= current:
            return rate.permits if window < current else rate.permits - b
        return -((window - current - 1) * rate.permits + b)

    def rate_charge(self, rate: Rate, a: int, b: int, extra: int, now: int) -> tuple[int, int]:
        # Added to the latest window, current or ahead (a new current one when it has ended);
        # past its rate, the rest goes to the windows after it, as reservations would.
        window = now // rate.interval_us
        if window_of(a, rate.interval_us) >= window:
            window, count = window_of(a, rate.interval_us), b + extra
        else:
            count = extra
        ahead = max(0, -(-(count - rate.permits) // rate.permits))
        return (window + ahead + 1) * rate.interval_us, count - ahead * rate.permits


def windows_outlived(windows: FixedWindow, old: tuple[Rate, ...], now: int) -> bool:
    """set_rate with keep_state, an OVERALL limiter (fixed_window.lua's
    ``windows_outlived``): its state is forgotten when a PER_CLIENT client's key would have
    expired, ``HELD_BUCKETS`` intervals of the old rates after its latest window's end."""
    n = windows.state.n
    return all(
        (window_of(n[2 * i], was.interval_us) + 1 + HELD_BUCKETS) * was.interval_us <= now
        for i, was in enumerate(old)
        if 2 * i < len(n)
    )
