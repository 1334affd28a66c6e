"""What a sliding window's log keeps of the grants it has reclaimed (held.lua, step for
step): up to ``HELD_BUCKETS`` entries ``[permits, at]``, oldest first, each the permits of
reclaimed grants that started in one interval-aligned span, ``at`` the latest start among
them; set_rate with keep_state logs again those the new window counts."""

from __future__ import annotations

from .._protocol import HELD_BUCKETS, format_member
from ._state import Budget


def kept_until(keep_alive: int, counts: int, horizon: int, now: int) -> int:
    """Until when a budget's state is kept (held.lua's ``kept_until``): what it counts until
    ``counts``, its summary until ``horizon``, but with a ``keep_alive`` (us) no longer than
    that after the call once the grants have stopped counting: the config goes then."""
    if keep_alive > 0:
        return min(horizon, max(counts, now + keep_alive))
    return horizon


def hold(budget: Budget, permits: int, at: int, interval: int) -> None:
    """Keeps ``permits`` of grants reclaimed from the log, the latest of which started at
    ``at``."""
    if permits <= 0:
        return
    held = budget.held
    if held and held[-1][1] // interval == at // interval:
        held[-1] = [held[-1][0] + permits, max(held[-1][1], at)]
        return
    held.append([permits, at])
    if len(held) > HELD_BUCKETS:
        del held[0]


def restore_held(budget: Budget, interval: int, now: int) -> int:
    """Logs again the held entries the (new) ``interval`` still counts at ``now``, each as
    one grant at its ``at``; returns the permits logged. The walk cursor starts over."""
    kept: list[list[int]] = []
    back = 0
    for permits, at in budget.held:
        if at > now - interval:
            budget.seq += 1
            budget.add((at, format_member(permits, budget.seq), permits))
            back += permits
        else:
            kept.append([permits, at])
    if back:
        budget.held, budget.used, budget.cs = kept, budget.used + back, None
    return back
