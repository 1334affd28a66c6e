"""A provider's floor on fixed windows (carries.lua, step for step).

``sync(remaining, reset)`` at ``since``, whose reset (at most one interval on) ends at
``until``, is carried into the window ``until`` falls in (the carry's window): that window
counts ``count`` more until ``until``, and a window before it at least ``count``. A reset
past the current window's end is carried into the next window as ``rate - remaining``: the
current window keeps counting its own grants and allows no more than ``remaining`` of them,
and every permit it grants from the sync on (a grant, or a charge) is added to ``count``, so
that the next window starts from what the provider has counted. A reset within the current
window is carried into it: what its own count lacks of ``rate - remaining``. From ``until``
on, a window's own count alone applies.

A grant that started after ``since`` in a window before the carry's window takes its permits
back from ``count`` when it is handed back (release, settle): a hand-back frees in both
windows what it took there, never more. One from before the sync, in a window that ends
before ``until``, frees nothing until then (its window counts at least ``count``), as a
sliding window keeps such grants until the reset.

Per rate at most ``CARRIES`` carries (into the current window, and into the next), kept in
``Budget.carried`` as ``[rate (from 1), count, until, since]``, ordered by rate, until, since
and count. A budget without one takes the counters' own ways (``Counters``)."""

from __future__ import annotations

from ..._types import MAX_RATES, Rate
from .._protocol import CARRIES, parse_grant
from ._counters import Counters
from ._state import Limiter

Carry = list[int]
"""``[rate (from 1), count, until, since]``."""


def carry_window(rate: Rate, carry: Carry) -> int:
    """The number of the window a carry's ``until`` falls in."""
    return (carry[2] - 1) // rate.interval_us


def counted(rate: Rate, i: int, carries: list[Carry], window: int, own: int, at: int) -> int:
    """The permits window ``window`` of rate ``i`` counts at ``at`` (in it, not before now),
    its own grants ``own`` among them."""
    into, least = own, 0
    for carry in carries:
        if carry[0] == i and at < carry[2]:
            into_window = carry_window(rate, carry)
            if into_window == window:
                into += carry[1]
            elif into_window > window:
                least = max(least, carry[1])
    return max(into, least)


def opened(rate: Rate, a: int, b: int, now: int) -> tuple[int, int, bool]:
    """``(window, its own permits, ahead)``: the window a request at ``now`` goes into first,
    the latest when it has not begun (reservations), else the current one."""
    window, current = (a - 1) // rate.interval_us, now // rate.interval_us
    if window > current:
        return window, b, True
    return current, b if window == current else 0, False


def loaded(carries: list[Carry], rates: tuple[Rate, ...]) -> list[Carry]:
    """The carries of rates the config still has, each for at most one interval after its
    sync (set_rate with keep_state may have shortened it)."""
    return [
        [i, count, min(until, since + rates[i - 1].interval_us), since]
        for i, count, until, since in carries[: CARRIES * MAX_RATES]
        if i <= len(rates)
    ]


def carried_left(rate: Rate, i: int, carries: list[Carry], a: int, b: int, now: int) -> int:
    window, own, ahead = opened(rate, a, b, now)
    if ahead:
        return 0
    return rate.permits - counted(rate, i, carries, window, own, now)


def carried_room(rate: Rate, i: int, carries: list[Carry], a: int, b: int, now: int) -> int:
    # `left`, less the permits of the windows ahead (a reservation, a debt), as rate_room.
    window, own, ahead = opened(rate, a, b, now)
    if not ahead:
        return rate.permits - counted(rate, i, carries, window, own, now)
    ends = (window - now // rate.interval_us - 1) * rate.permits
    return -(ends + counted(rate, i, carries, window, own, window * rate.interval_us))


def carried_start(
    rate: Rate, i: int, carries: list[Carry], a: int, b: int, permits: int, now: int
) -> int:
    """The earliest start at which rate ``i`` allows ``permits``: in the window a request goes
    into first, or when a carry into it ends; else in the next, or when a carry into it ends."""
    first, own, _ = opened(rate, a, b, now)
    for window in (first, first + 1):
        at = max(now, window * rate.interval_us)
        if counted(rate, i, carries, window, own, at) + permits <= rate.permits:
            return at
        for carry in carries:
            until = carry[2]
            if (
                carry[0] == i
                and until > at
                and carry_window(rate, carry) == window
                and counted(rate, i, carries, window, own, until) + permits <= rate.permits
            ):
                return until
        own = 0
    return (first + 1) * rate.interval_us


def carry_grant(rate: Rate, i: int, carries: list[Carry], permits: int, start: int) -> None:
    """``permits`` taken at ``start`` (a grant, or a charge at now): a window before a carry's
    window takes them from its carry too, until the carry ends."""
    window = start // rate.interval_us
    for carry in carries:
        if carry[0] == i and start < carry[2] and window < carry_window(rate, carry):
            carry[1] += permits


def carry_back(rate: Rate, i: int, carries: list[Carry], permits: int, start: int, now: int) -> int:
    """``permits`` of the grant that started at ``start`` handed back at ``now``: what it took
    from a carry after its sync goes back to it. The most any carry gave back."""
    window, back = start // rate.interval_us, 0
    for carry in carries:
        if (
            carry[0] == i
            and now < carry[2]
            and start > carry[3]
            and window < carry_window(rate, carry)
        ):
            count = min(permits, carry[1])
            carry[1] -= count
            back = max(back, count)
    return back


def carry_into(
    rate: Rate, i: int, carries: list[Carry], window: int, least: int, until: int, now: int
) -> list[Carry]:
    """A sync at ``now`` whose reset ends at ``until`` in ``window`` (the current one, or the
    next): the carry into it holds at least ``least`` until then. One there already is
    tightened (and counts from this sync); else the rate's carries that have ended go, and
    (a rate's carries brought together by set_rate) at most CARRIES stay."""
    into = [c for c in carries if c[0] == i and now < c[2] and carry_window(rate, c) == window]
    for carry in into:
        carry[1], carry[2], carry[3] = max(carry[1], least), max(carry[2], until), now
    if not into:
        mine = [c for c in carries if c[0] == i and now < c[2]]
        if len(mine) >= CARRIES:
            mine = [
                [
                    i,
                    sum(c[1] for c in mine),
                    max(c[2] for c in mine),
                    max(c[3] for c in mine),
                ]
            ]
        carries = [c for c in carries if c[0] != i] + mine + [[i, least, until, now]]
    return sorted(carries, key=lambda c: (c[0], c[2], c[3], c[1]))


def carry_sync(
    rate: Rate, i: int, carries: list[Carry], a: int, b: int, least: int, until: int, now: int
) -> list[Carry] | None:
    """The carries once rate ``i`` allows at most rate - ``least`` more until ``until``
    (None: as they are). A reset past the current window's end is carried into the next
    window, ``least`` and the grants from now on; one within it into the current window,
    what its own count lacks (nothing, behind reservations: it allows none more)."""
    window, own, ahead = opened(rate, a, b, now)
    if until > (now // rate.interval_us + 1) * rate.interval_us:
        return carry_into(rate, i, carries, now // rate.interval_us + 1, least, until, now)
    if ahead or least <= own:
        return None
    return carry_into(rate, i, carries, window, least - own, until, now)


class Carried(Counters):
    """Fixed windows with carries (``FixedWindow``'s base): the group's operations when a
    carry is kept, and ``sync``. Without one, each is the counters' own."""

    __slots__ = ()

    def left(self, now: int) -> tuple[int, int]:
        carries, n = self.state.carried, self.state.n
        if not carries:
            return super().left(now)
        return min(
            (carried_left(rate, i + 1, carries, n[2 * i], n[2 * i + 1], now), i)
            for i, rate in enumerate(self.config.rates)
        )

    def start(self, permits: int, now: int) -> int | None:
        carries, n = self.state.carried, self.state.n
        if not carries:
            return super().start(permits, now)
        start = now
        for i, rate in enumerate(self.config.rates):
            at = carried_start(rate, i + 1, carries, n[2 * i], n[2 * i + 1], permits, now)
            start = max(start, at)
        return start

    def room(self, now: int) -> int:
        carries, n = self.state.carried, self.state.n
        if not carries:
            return super().room(now)
        return min(
            carried_room(rate, i + 1, carries, n[2 * i], n[2 * i + 1], now)
            for i, rate in enumerate(self.config.rates)
        )

    def commit(self, permits: int, start: int) -> str:
        member = super().commit(permits, start)
        for i, rate in enumerate(self.config.rates):
            carry_grant(rate, i + 1, self.state.carried, permits, start)
        return member

    def charge(self, member: str, extra: int, now: int) -> str:
        settled = super().charge(member, extra, now)
        for i, rate in enumerate(self.config.rates):
            carry_grant(rate, i + 1, self.state.carried, extra, now)
        return settled

    def release(self, wanted: int, member: str | None, now: int) -> int:
        if not self.state.carried:
            return super().release(wanted, member, now)
        permits, start = wanted, None
        if member is not None:
            permits, start, _ = parse_grant(member)
        before = self.counts(now if start is None else start, now)
        super().release(wanted, member, now)
        return self.handed_back(before, permits, start, now)

    def shrink(self, member: str, wanted: int, now: int) -> tuple[int, str]:
        if not self.state.carried:
            return super().shrink(member, wanted, now)
        start = parse_grant(member)[1]
        before = self.counts(start, now)
        settled = super().shrink(member, wanted, now)[1]
        return self.handed_back(before, wanted, start, now), settled

    def counts(self, at: int, now: int) -> list[int]:
        """What each rate's window of ``at`` counts (0: one that has ended)."""
        carries, n, counts = self.state.carried, self.state.n, []
        for i, rate in enumerate(self.config.rates):
            window, interval = at // rate.interval_us, rate.interval_us
            if window < now // interval:
                counts.append(0)
                continue
            own = n[2 * i + 1] if (n[2 * i] - 1) // interval == window else 0
            counts.append(counted(rate, i + 1, carries, window, own, max(now, window * interval)))
        return counts

    def handed_back(self, before: list[int], permits: int, start: int | None, now: int) -> int:
        """What a hand-back of ``permits`` of the grant that started at ``start`` (None: the
        latest grants, which take nothing back from a carry) freed: in its window (``before``:
        what each rate's counted), or in a carry's."""
        after = self.counts(now if start is None else start, now)
        freed = 0
        for i, rate in enumerate(self.config.rates):
            back = 0
            if start is not None:
                back = carry_back(rate, i + 1, self.state.carried, permits, start, now)
            if back:
                self.dirty = True
            freed = max(freed, back, before[i] - after[i])
        return freed

    def sync(self, remaining: int, reset_us: int, now: int) -> None:
        n = self.state.n
        for i, rate in enumerate(self.config.rates):
            least, until = rate.permits - remaining, now + min(reset_us, rate.interval_us)
            if reset_us <= 0 or least <= 0:
                continue
            carries = carry_sync(
                rate, i + 1, self.state.carried, n[2 * i], n[2 * i + 1], least, until, now
            )
            if carries is not None:
                self.state.carried = carries
                self.dirty, self.fresh = True, False

    def save(self, limiter: Limiter, now: int) -> int:
        if self.dirty and self.state.carried:
            self.state.carried = [carry for carry in self.state.carried if carry[2] > now]
            self.tail_until = max((carry[2] for carry in self.state.carried), default=0)
        return super().save(limiter, now)

    def carrying(self, now: int) -> bool:
        """A carry still counts at ``now``."""
        return any(carry[2] > now for carry in self.state.carried)
