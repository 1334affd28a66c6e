"""A provider's count on a sliding window's log (sliding_floors.lua, step for step).

``sync(remaining, reset)`` at ``now``, whose reset (at most one interval on) ends at
``until``: what the provider counts beyond the log's grants that have started is logged as an
entry of its own that leaves the window at ``until``; and a provider that holds the log's
grants longer than the log does holds them that much longer in the log as well: until
``until``, the window is ``lag = until - (newest start + interval)`` longer.

A later count replaces an earlier one: the entry of what the last count said the provider
counts beyond the log's grants (``Budget.excess``) goes before the next is logged. The log's
own grants are never freed by a count.

A log keeps at most ``LAGS`` lags, ``Budget.lags``: ``[lag, until]`` each."""

from __future__ import annotations

import bisect

from .._protocol import WALK_STEPS, format_member
from ._state import Budget

LAGS = 2


def lag_at(lags: list[list[int]], now: int) -> int:
    """How much longer the window is at ``now`` (0: as the rate says)."""
    return max((lag for lag, until in lags if now < until), default=0)


def kept(lags: list[list[int]], now: int) -> list[list[int]]:
    """The lags that still count at ``now``."""
    return [entry for entry in lags if entry[1] > now]


def add_lag(lags: list[list[int]], lag: int, until: int, now: int) -> list[list[int]]:
    """The lags once ``lag`` holds until ``until``: those it covers go; one that covers it
    stays alone; of more than ``LAGS``, the two that end first become one."""
    staying = []
    for entry in lags:
        if entry[1] > now and not (entry[0] <= lag and entry[1] <= until):
            if entry[0] >= lag and entry[1] >= until:
                return lags
            staying.append(entry)
    staying.append([lag, until])
    if len(staying) > LAGS:
        staying.sort(key=lambda entry: entry[1])
        staying = [[max(staying[0][0], staying[1][0]), staying[1][1]], staying[2]]
    return staying


def started_and_booked(budget: Budget, now: int) -> tuple[int | None, int]:
    """The newest start at or before ``now`` in the log (None: none), and the permits of the
    grants that start after ``now`` (of its ``WALK_STEPS`` newest entries)."""
    grants, started = budget.grants, budget.rank_after(now)
    newest = grants[started - 1][0] if started > budget.head else None
    ahead = grants[max(started, len(grants) - WALK_STEPS) :]
    return newest, sum(permits for _, _, permits in ahead)


def drop_excess(budget: Budget) -> None:
    """The entry of a provider's last count, out of the log if it is still logged there."""
    excess, budget.excess = budget.excess, None
    if excess is None:
        return
    permits, seq, start = excess
    logged = (start, format_member(permits, seq), permits)
    grants = budget.grants
    at = bisect.bisect_left(grants, logged, lo=budget.head)
    if at < len(grants) and grants[at] == logged:
        del grants[at]
        budget.moved(start, -permits)
        budget.used -= permits


def kept_excess(excess: list[int] | None, interval: int, now: int) -> list[int] | None:
    """The entry of the last count, while it may still be logged."""
    return None if excess is None or excess[2] + interval <= now else excess
