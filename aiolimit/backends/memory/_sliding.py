"""The sliding window (sliding_window.lua, step for step): a log of grants per rate, each
entry scored by its start; a grant counts until one interval after it starts."""

from __future__ import annotations

import bisect

from ..._types import RateLimiterConfig
from .._protocol import (
    HELD_BUCKETS,
    MAX_EXACT,
    RECLAIM_STEPS,
    WALK_STEPS,
    format_grant,
    format_member,
    parse_grant,
    parse_member,
)
from . import _sliding_floors as floors
from ._algorithm import Group
from ._held import hold, kept_until, restore_held
from ._state import Budget, Limiter, Slot, ms


def may_restart(budget: Budget, now: int) -> bool:
    """Whether the log's sequence may start over at ``now``: no grant handed back starts
    then or later (sliding_log.lua's ``may_restart``)."""
    return budget.handed is None or budget.handed < now


def handed_back(budget: Budget, start: int) -> None:
    """A grant that started at ``start`` was handed back: its slot is free, its number not
    (sliding_log.lua)."""
    budget.handed = start if budget.handed is None else max(budget.handed, start)


def reclaim_log(budget: Budget, interval: int, now: int, write: bool) -> int:
    """Permits used once grants that left the window (``interval`` up to ``now``) are
    reclaimed (at most ``RECLAIM_STEPS`` of them); with ``write`` they are removed from the
    budget, and kept as held (held.lua)."""
    window_start = now - interval
    grants, head = budget.grants, budget.head
    count = min(budget.rank_after(window_start) - head, RECLAIM_STEPS)
    if count == 0:
        return budget.used
    if count == RECLAIM_STEPS and grants[-1][0] <= window_start:
        if write:  # the whole log has expired
            hold(budget, budget.used, grants[-1][0], interval)
            budget.used = 0
            if may_restart(budget, now):
                budget.seq = 0
            budget.clear()
        return 0
    used = budget.used - sum(p for _, _, p in grants[head : head + count])
    if write:
        last = grants[head + count - 1][0]
        hold(budget, budget.used - used, last, interval)
        budget.drop_front(count)
        if budget.cs is not None and budget.cs <= last:
            budget.cs = None
        elif budget.cs is not None:
            budget.cp -= budget.used - used
        budget.used = used
        if used == 0 and may_restart(budget, now):
            budget.seq = 0  # an empty log starts over, as a budget whose keys expired does
    return used


def _walk_forward(budget: Budget, need: int) -> int | None:
    grants = budget.grants
    rank, prefix = budget.head, 0
    if budget.cs is not None:
        rank, prefix = budget.rank_after(budget.cs), budget.cp
    found: int | None = None
    group_score: int | None = None
    group = steps = 0
    size = 16
    while steps < WALK_STEPS:
        entries = grants[rank : rank + size]
        for score, _, permits in entries:
            if found is not None and score != found:
                budget.cs, budget.cp, budget.cg = found, prefix, group
                return found
            if score == group_score:
                group += permits
            else:
                group_score, group = score, permits
            prefix += permits
            rank, steps = rank + 1, steps + 1
            if found is None and prefix >= need:
                found = score
        if len(entries) < size:  # the end of the log
            if found is not None:
                budget.cs, budget.cp, budget.cg = found, prefix, group
            return found
        size = min(size * 4, WALK_STEPS - steps + 1)
    if found is not None:
        return found
    # Out of steps: with at least one permit per entry, `need` is reached at most this far.
    return grants[min(rank - 1 + need - prefix, len(grants) - 1)][0]


def _walk_back(budget: Budget, need: int) -> int:
    assert budget.cs is not None
    answer = budget.cs
    below = budget.cp - budget.cg
    if below < need:
        return answer
    top = bisect.bisect_left(budget.grants, (budget.cs, "", 0), lo=budget.head)
    older = budget.grants[budget.head : top][::-1]  # newest first
    group_score: int | None = None
    group = offset = steps = 0
    size = 16
    while steps < WALK_STEPS:
        entries = older[offset : offset + size]
        for score, _, permits in entries:
            if group_score is not None and score != group_score:
                answer = group_score
                budget.cs, budget.cp, budget.cg = group_score, below, group
                below -= group
                if below < need:
                    return answer
                group = 0
            group_score = score
            group += permits
            steps += 1
        if len(entries) < size:  # the start of the log
            if group_score is not None:
                budget.cs, budget.cp, budget.cg = group_score, below, group
                return group_score
            return answer
        offset += size
        size = min(size * 4, WALK_STEPS - steps + 1)
    return answer if group_score is None else group_score


def wait_for(budget: Budget, need: int, interval: int, now: int) -> int:
    """Microseconds from ``now`` until ``need`` more permits have left the window."""
    if budget.cs is not None and budget.cp >= need:
        at: int | None = _walk_back(budget, need)
    else:
        at = _walk_forward(budget, need)
    if at is None:
        return interval
    return max(at + interval - now, 1)


def store_log(
    budget: Budget, interval: int, now: int, deadline: int | None, keep_alive: int
) -> bool:
    """Gives the budget a TTL of ``HELD_BUCKETS`` intervals from its newest grant, logged,
    held or handed back (not past ``kept_until``, nor the limiter's ``deadline``); False:
    nothing is left, the budget is gone."""
    newest = [budget.grants[-1][0]] if len(budget.grants) > budget.head else []
    newest += [budget.held[-1][1]] if budget.held else []
    newest += [] if budget.handed is None else [budget.handed]  # (sliding_log.lua)
    budget.lags = floors.kept(budget.lags, now)
    budget.excess = floors.kept_excess(budget.excess, interval, now)
    if not newest:
        return False
    last = max(newest)
    until = kept_until(keep_alive, last + interval, last + HELD_BUCKETS * interval, now)
    if until <= now:
        return False
    ttl = ms(until - now)
    if deadline is not None:
        ttl = max(min(ttl, ms(deadline - now)), 1000)
    budget.expires_at = now + ttl
    return True


def release_log(budget: Budget, permits: int, member: str | None, now: int) -> int:
    """Removes the grant ``member`` (see ``format_grant``) from one log, if it is still there
    and started when it says (a log entry numbered as it is, from another life of the log,
    is another grant); or ``permits`` from its newest started grants."""
    grants, released = budget.grants, 0
    if member is not None:
        permits, start, seq = parse_grant(member)
        entry = (start, format_member(permits, seq), permits)
        i = bisect.bisect_left(grants, entry, lo=budget.head)
        if i < len(grants) and grants[i] == entry:
            del grants[i]
            budget.moved(start, -permits)
            handed_back(budget, start)
            released = permits
        return released
    # Reservations (grants starting in the future) belong to waiting callers.
    started = budget.rank_after(now)
    for index in range(started - 1, max(started - WALK_STEPS, budget.head) - 1, -1):
        if released >= permits:
            break
        time, logged, entry_permits = grants.pop(index)
        handed_back(budget, time)
        take = min(entry_permits, permits - released)
        budget.moved(time, -take)
        released += take
        if take < entry_permits:
            rest = entry_permits - take
            budget.add((time, format_member(rest, parse_member(logged)[1]), rest))
    return released


class SlidingLog(Group):
    """A log per rate (``budgets``; ``stored`` says which exist): the first rate's in
    ``Limiter.budgets``, rate i's (i > 1) in ``Limiter.extra``."""

    __slots__ = ("budgets", "intervals", "stored", "touched", "used")

    idempotent = True  # a grant handed back is no longer in the log
    logs_grants = True

    def __init__(
        self, limiter: Limiter, config: RateLimiterConfig, key: str | None, write: bool
    ) -> None:
        super().__init__(limiter, config, key, write)
        self.budgets: list[Budget] = []
        self.stored: list[bool] = []
        for i in range(1, len(config.rates) + 1):
            budget = limiter.budgets.get(key) if i == 1 else limiter.extra.get((key, i))
            self.stored.append(budget is not None)
            self.budgets.append(Budget() if budget is None else budget)
        self.touched = [False] * len(self.budgets)
        self.used = [budget.used for budget in self.budgets]  # as reclaim leaves them
        # Each log's window, longer while a provider holds its grants longer (reclaim).
        self.intervals = [rate.interval_us for rate in config.rates]
        self.fresh = not any(self.stored)

    def reclaim(self, now: int) -> None:
        for i, (budget, rate) in enumerate(zip(self.budgets, self.config.rates, strict=False)):
            if self.write and self.stored[i] and restore_held(budget, rate.interval_us, now):
                self.touched[i] = True  # after set_rate to a longer interval (held.lua)
            before = budget.used
            # (longer while a provider holds the log's grants longer: sliding_floors.lua)
            base = rate.interval_us
            self.intervals[i] = base + min(floors.lag_at(budget.lags, now), base)
            self.used[i] = reclaim_log(budget, self.intervals[i], now, self.write)
            if self.write and self.used[i] != before:
                self.touched[i] = True  # what the reclaim changed is written back

    def left(self, now: int) -> tuple[int, int]:
        return min(
            (r.permits - u, i)
            for i, (r, u) in enumerate(zip(self.config.rates, self.used, strict=True))
        )

    def latest(self) -> int | None:
        if len(self.budgets) == 1 and not self.config.min_spacing_us:
            return None  # one rate keeps its requests in order by itself
        newest = [
            b.grants[-1][0]
            for b, kept in zip(self.budgets, self.stored, strict=True)
            if kept and len(b.grants) > b.head
        ]
        return max(newest) if newest else None

    def start(self, permits: int, now: int) -> int | None:
        # The walk counts the expired grants still logged: without `write` a budget's `used`
        # is what the unreclaimed log says, which it needs; and its cursor is not kept (a
        # read writes nothing, as wait.lua).
        cursors = [(b.cs, b.cp, b.cg) for b in self.budgets]
        start = now
        try:
            for i, (budget, rate) in enumerate(zip(self.budgets, self.config.rates, strict=True)):
                held = self.used[i]
                if held + permits > MAX_EXACT:
                    return None
                if rate.permits - held < permits and self.stored[i]:
                    need = permits - (rate.permits - budget.used)
                    start = max(start, now + wait_for(budget, need, self.intervals[i], now))
        finally:
            if not self.write:
                for budget, (cs, cp, cg) in zip(self.budgets, cursors, strict=True):
                    budget.cs, budget.cp, budget.cg = cs, cp, cg
        return start

    def commit(self, permits: int, start: int) -> str:
        self.fresh = False
        seq = max(b.seq for b in self.budgets) + 1
        logged = format_member(permits, seq)
        for i, budget in enumerate(self.budgets):
            budget.add((start, logged, permits))
            budget.seq = seq
            budget.used += permits
            self.used[i] = budget.used
            budget.moved(start, permits)
            self.touched[i] = self.stored[i] = True
        return format_grant(permits, start, seq)

    def keep(self) -> None:
        self.touched = [t or kept for t, kept in zip(self.touched, self.stored, strict=True)]

    def save(self, limiter: Limiter, now: int) -> int:
        assert limiter.config is not None
        deadline, longest = limiter.config.deadline, 0
        keep_alive = self.config.keep_alive_us or 0
        for i, budget in enumerate(self.budgets):
            if not self.touched[i]:
                continue
            slot: Slot = self.key if i == 0 else (self.key, i + 1)
            if store_log(budget, self.intervals[i], now, deadline, keep_alive):
                limiter.store(slot, budget)
                self.stored[i] = True
                longest = max(longest, int(budget.expires_at) - now)
            else:
                limiter.unstore(slot)
                self.stored[i] = False
        return longest

    def queued(self, now: int) -> tuple[int, int] | None:
        # (at most WALK_STEPS entries of each log, as sliding_window.lua reads them)
        permits, latest = 0, None
        for budget in self.budgets:
            ahead = budget.grants[max(budget.rank_after(now), len(budget.grants) - WALK_STEPS) :]
            total = sum(entry_permits for _, _, entry_permits in ahead)
            if total > 0:
                permits = max(permits, total)
                latest = ahead[-1][0] if latest is None else max(latest, ahead[-1][0])
        return None if latest is None else (permits, latest)

    def release(self, wanted: int, member: str | None, now: int) -> int:
        released = 0
        for i, budget in enumerate(self.budgets):
            if not self.stored[i]:
                continue
            count = release_log(budget, wanted, member, now)
            if count:
                budget.used -= count
                self.used[i] = budget.used
                self.touched[i] = True
            released = max(released, count)
        return released

    def shrink(self, member: str, wanted: int, now: int) -> tuple[int, str]:
        # Its entry in each log that still counts it, rewritten with fewer permits at the
        # same score (removed for none): sliding_window.lua's `shrink`.
        permits, start, seq = parse_grant(member)
        kept, back = permits - wanted, 0
        logged = (start, format_member(permits, seq), permits)
        for i, budget in enumerate(self.budgets):
            if not self.stored[i] or start <= now - self.intervals[i]:
                continue
            grants = budget.grants
            at = bisect.bisect_left(grants, logged, lo=budget.head)
            if at == len(grants) or grants[at] != logged:
                continue
            del grants[at]
            if kept:
                budget.add((start, format_member(kept, seq), kept))
            budget.moved(start, -wanted)
            handed_back(budget, start)
            budget.used -= wanted
            self.used[i] = budget.used
            self.touched[i] = True
            back = wanted
        return back, format_grant(kept, start, seq) if back else member

    def charge(self, member: str, extra: int, now: int) -> str:
        # An entry of its own at `now`: the grant keeps its entry, the member its number.
        permits, start, seq = parse_grant(member)
        self.commit(extra, now)
        return format_grant(permits + extra, start, seq)

    def sync(self, remaining: int, reset_us: int, now: int) -> None:
        # A lag that holds the log's grants as long as the provider does, and an entry of
        # what it counts beyond them, leaving the window at the reset (sliding_window.lua).
        if reset_us <= 0:
            return
        seq = max(b.seq for b in self.budgets) + 1
        for i, (budget, rate) in enumerate(zip(self.budgets, self.config.rates, strict=True)):
            if self.stored[i] and budget.excess is not None:  # (the last count's, replaced)
                floors.drop_excess(budget)
                self.used[i] = budget.used
                self.touched[i] = True
            least = rate.permits - remaining
            if least <= 0:
                continue
            base = rate.interval_us
            until = now + min(reset_us, base)
            newest, booked = floors.started_and_booked(budget, now) if self.stored[i] else (None, 0)
            lag = 0 if newest is None else until - (newest + base)
            if lag > 0:  # (grants that left the window already count in `extra`)
                budget.lags = floors.add_lag(budget.lags, lag, until, now)
                self.touched[i] = True
            extra = least - (self.used[i] - booked)
            if extra <= 0:
                continue
            at = until - base
            budget.add((at, format_member(extra, seq), extra))
            budget.seq, budget.excess = seq, [extra, seq, at]
            budget.used += extra
            self.used[i] = budget.used
            budget.moved(at, extra)
            self.touched[i] = self.stored[i] = True
            self.fresh = False
