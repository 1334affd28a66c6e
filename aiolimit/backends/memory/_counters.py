"""What the token bucket and fixed windows share (counters.lua): per rate two numbers, kept
in one value (an OVERALL budget's in the config, a PER_CLIENT client's in its value key),
plus the latest grant's start. Each algorithm says what the two numbers mean by the per-rate
methods of :class:`Counters`."""

from __future__ import annotations

import abc
from dataclasses import replace

from ..._types import Rate, RateLimiterConfig
from .._protocol import MAX_EXACT, format_grant, parse_grant
from ._algorithm import Group
from ._state import Budget, Limiter, ms


class Counters(Group):
    """A budget kept as numbers: ``state.n`` holds two per rate, ``state.last`` the latest
    grant's start."""

    __slots__ = ("dirty", "handed", "state", "tail_until")

    in_hash = True  # (an OVERALL budget's numbers are a field of its config: counters.lua)

    def __init__(
        self, limiter: Limiter, config: RateLimiterConfig, key: str | None, write: bool
    ) -> None:
        super().__init__(limiter, config, key, write)
        self.dirty = False
        self.handed: int | None = None  # the latest start handed back by this call (counters.lua)
        # Until when what the algorithm keeps besides its numbers counts (0: nothing), for save.
        self.tail_until = 0
        assert limiter.config is not None
        state = limiter.config.state if self.state_in_config(config) else limiter.budgets.get(key)
        size = 2 * len(config.rates)
        if state is None:
            self.state = Budget(n=[0] * size)  # full buckets; no window yet
            return
        # set_rate with keep_state may have changed the rates: each keeps its own numbers by
        # position, a rate added starts afresh, and `loaded` adapts what another rate left.
        # That is a copy, stored only if saved. (Otherwise the state is used as it is: only
        # commit and release change it, and both save it.)
        n = state.n
        if len(n) != size or any(
            self.loaded(rate, n[2 * i], n[2 * i + 1]) is not None
            for i, rate in enumerate(config.rates)
            if 2 * i + 1 < len(n)
        ):
            n = [n[i] if i < len(n) else 0 for i in range(size)]
            for i, rate in enumerate(config.rates):
                pair = self.loaded(rate, n[2 * i], n[2 * i + 1])
                if pair is not None:
                    n[2 * i], n[2 * i + 1] = pair
            state = replace(state, n=n)
        self.state, self.fresh = state, False

    # -- what each algorithm says, per rate: its two numbers (a, b) --------------------------

    def loaded(self, rate: Rate, a: int, b: int) -> tuple[int, int] | None:
        """The numbers as this rate reads them when another rate may have written them
        (None: as they are)."""
        return None

    @abc.abstractmethod
    def rate_left(self, rate: Rate, a: int, b: int, now: int) -> int:
        """Permits the rate allows at ``now``."""

    @abc.abstractmethod
    def rate_start(self, rate: Rate, a: int, b: int, permits: int, now: int) -> int:
        """The earliest time at which the rate allows ``permits`` (may be before ``now``)."""

    @abc.abstractmethod
    def rate_take(self, rate: Rate, a: int, b: int, permits: int, start: int) -> tuple[int, int]:
        """The numbers once ``permits`` are taken at ``start``."""

    @abc.abstractmethod
    def rate_tag(self, rate: Rate, a: int, b: int, permits: int, start: int) -> int:
        """What tells a grant from the others of its budget that start at ``start``, from the
        first rate's numbers once it has taken ``permits`` (see ``format_grant``)."""

    @abc.abstractmethod
    def rate_span(self, rate: Rate) -> int:
        """The largest tag ``rate_tag`` gives (see ``tagged``)."""

    def rate_queued(self, rate: Rate, a: int, b: int) -> int | None:
        """The start of the latest grant when it is a reservation, for a rule whose numbers
        cannot hold a hole (None: the rule can hand back any grant)."""
        return None

    @abc.abstractmethod
    def rate_until(self, rate: Rate, a: int, b: int, now: int) -> int:
        """Until when the numbers matter (after it the rate allows its full count, and a
        longer interval has nothing to count)."""

    @abc.abstractmethod
    def rate_release(
        self, rate: Rate, a: int, b: int, wanted: int, start: int | None, now: int, held: int
    ) -> tuple[int, int, int]:
        """``(permits handed back, a, b)`` for ``wanted`` of the ``held`` permits of the grant
        that started at ``start`` (None: ``wanted`` of the latest grants): no more than it
        still holds at ``now``."""

    # -- the group --------------------------------------------------------------------------

    def reclaim(self, now: int) -> None:
        pass  # the numbers say by themselves what has run out

    def left(self, now: int) -> tuple[int, int]:
        n = self.state.n
        return min(
            (self.rate_left(rate, n[2 * i], n[2 * i + 1], now), i)
            for i, rate in enumerate(self.config.rates)
        )

    def latest(self) -> int | None:
        return self.state.last

    def start(self, permits: int, now: int) -> int | None:
        n, start = self.state.n, now
        for i, rate in enumerate(self.config.rates):
            start = max(start, self.rate_start(rate, n[2 * i], n[2 * i + 1], permits, now))
        return start

    def commit(self, permits: int, start: int) -> str:
        state, n = self.state, self.state.n
        state.last = start if state.last is None else max(state.last, start)
        for i, rate in enumerate(self.config.rates):
            n[2 * i], n[2 * i + 1] = self.rate_take(rate, n[2 * i], n[2 * i + 1], permits, start)
        self.dirty, self.fresh = True, False
        tag = self.rate_tag(self.config.rates[0], n[0], n[1], permits, start)
        return format_grant(permits, start, self.tagged(tag))

    def tagged(self, tag: int) -> int:
        """A grant's tag moved past every tag the rule gives once per hand-back the budget
        has seen, wrapping where it would not stay exact (counters.lua's ``tagged``): a
        handed-back slot taken again never gives a member twice."""
        count = self.state.handbacks
        if not count:
            return tag
        span = self.rate_span(self.config.rates[0]) + 1
        return tag + (count % max(1, (MAX_EXACT - span) // span)) * span

    def keep(self) -> None:
        self.dirty = not self.fresh

    def save(self, limiter: Limiter, now: int) -> int:
        stored = limiter.config
        assert stored is not None
        if not self.dirty:
            return 0
        config, state, n = self.config, self.state, self.state.n
        until = state.last + config.min_spacing_us if state.last is not None else 0
        for i, rate in enumerate(config.rates):
            until = max(until, self.rate_until(rate, n[2 * i], n[2 * i + 1], now))
        until = max(until, self.tail_until)
        if state.handbacks:
            # (a grant at this very time, or at a handed-back grant's start, must see the count)
            until = max(until, now + 1)
            if self.handed is not None:
                until = max(until, self.handed + config.longest_us)
        if until <= now:
            if self.state_in_config(config):
                stored.state = None
            else:
                limiter.unstore(self.key)
            return 0
        ttl = ms(until - now)
        if stored.deadline is not None:
            ttl = max(min(ttl, ms(stored.deadline - now)), 1000)
        if len(config.rates) == 1 and not config.min_spacing_us:
            state.last = None  # kept only where a later request needs it (counters.lua)
        if self.state_in_config(config):
            stored.state = state  # no TTL of its own: it goes with the config
        else:
            state.expires_at, state.epoch = now + ttl, stored.epoch
            limiter.store(self.key, state)
        return ttl

    def rate_ahead(self, rate: Rate, a: int, b: int, now: int) -> tuple[int, int]:
        """``(permits, start)``: at least the permits reserved to start after ``now``, and the
        latest such start (0 permits: none)."""
        return 0, now

    def queued(self, now: int) -> tuple[int, int] | None:
        n, permits, latest = self.state.n, 0, None
        for i, rate in enumerate(self.config.rates):
            ahead, start = self.rate_ahead(rate, n[2 * i], n[2 * i + 1], now)
            if ahead > 0:
                permits, latest = max(permits, ahead), max(latest or start, start)
        if latest is None:
            return None
        return permits, max(latest, self.state.last if self.state.last is not None else latest)

    def queued_start(self, now: int) -> int | None:
        """The start of the latest grant when it is a reservation (None: none, or a rule
        that can hand back any grant): the latest start kept, or else what the numbers say."""
        n, latest = self.state.n, self.state.last
        if latest is None:
            starts = [
                self.rate_queued(rate, n[2 * i], n[2 * i + 1])
                for i, rate in enumerate(self.config.rates)
            ]
            if None in starts:
                return None
            latest = max(start for start in starts if start is not None)
        return latest if latest > now else None

    def release(self, wanted: int, member: str | None, now: int) -> int:
        start, released, n = None, 0, self.state.n
        if member is not None:
            wanted, start, _ = parse_grant(member)
        if self.rate_queued(self.config.rates[0], n[0], n[1]) is not None:
            # Moving the numbers back for a grant that reservations are queued behind would
            # let the next request start on a slot one of them holds: only the latest goes.
            latest = self.queued_start(now)
            if latest is not None and latest != start:
                return 0
        for i, rate in enumerate(self.config.rates):
            count, n[2 * i], n[2 * i + 1] = self.rate_release(
                rate, n[2 * i], n[2 * i + 1], wanted, start, now, wanted
            )
            released = max(released, count)
        if released:
            self.dirty = True
            self.state.handbacks += 1
            self.was_handed(now if start is None else start)
        return released

    # -- settle and sync (counters.lua's) ----------------------------------------------------

    @abc.abstractmethod
    def rate_charge(self, rate: Rate, a: int, b: int, extra: int, now: int) -> tuple[int, int]:
        """The numbers once ``extra`` permits are taken at ``now``, whatever is free."""

    def rate_sync(
        self, rate: Rate, a: int, b: int, remaining: int, reset_us: int, now: int
    ) -> tuple[int, int]:
        """The numbers once the rate allows at most ``remaining`` more until the reset (for
        ``sync``; fixed windows keep a floor beside their numbers: _carries.py)."""
        raise NotImplementedError(f"{type(self).__name__} syncs otherwise")

    def was_handed(self, start: int) -> None:
        self.handed = start if self.handed is None else max(self.handed, start)

    def settled(self, permits: int, start: int, tag: int) -> str:
        """The member of a settled grant: its tag moved past every tag the rule gives once
        more than any grant's (the hand-back count moved by two: one for it, one after)."""
        state = self.state
        state.handbacks += 1
        self.was_handed(start)
        member = format_grant(
            permits, start, self.tagged(tag % (self.rate_span(self.config.rates[0]) + 1))
        )
        state.handbacks += 1
        self.dirty, self.fresh = True, False
        return member

    def shrink(self, member: str, wanted: int, now: int) -> tuple[int, str]:
        reserved, start, tag = parse_grant(member)
        n, back = self.state.n, 0
        queued = self.rate_queued(self.config.rates[0], n[0], n[1]) is not None
        latest = self.queued_start(now) if queued else None
        if latest is None or latest == start:  # (a token bucket: see release)
            for i, rate in enumerate(self.config.rates):
                count, n[2 * i], n[2 * i + 1] = self.rate_release(
                    rate, n[2 * i], n[2 * i + 1], wanted, start, now, reserved
                )
                back = max(back, count)
        return back, self.settled(reserved - wanted, start, tag)

    def rate_room(self, rate: Rate, a: int, b: int, now: int) -> int:
        """``rate_left``, less every permit reserved ahead (what a debt is measured from)."""
        return self.rate_left(rate, a, b, now)

    def room(self, now: int) -> int:
        n = self.state.n
        return min(
            self.rate_room(rate, n[2 * i], n[2 * i + 1], now)
            for i, rate in enumerate(self.config.rates)
        )

    def charge(self, member: str, extra: int, now: int) -> str:
        reserved, start, tag = parse_grant(member)
        n = self.state.n
        for i, rate in enumerate(self.config.rates):
            a, b = self.rate_charge(rate, n[2 * i], n[2 * i + 1], extra, now)
            if a != n[2 * i]:
                self.synced(i, a)
            n[2 * i], n[2 * i + 1] = a, b
        return self.settled(reserved + extra, start, tag)

    def sync(self, remaining: int, reset_us: int, now: int) -> None:
        n = self.state.n
        for i, rate in enumerate(self.config.rates):
            a, b = self.rate_sync(rate, n[2 * i], n[2 * i + 1], remaining, reset_us, now)
            if (a, b) != (n[2 * i], n[2 * i + 1]):
                if a != n[2 * i]:
                    self.synced(i, a)
                n[2 * i], n[2 * i + 1] = a, b
                self.dirty, self.fresh = True, False

    def synced(self, i: int, window_end: int) -> None:
        """Rate ``i`` (from 0) takes the new numbers ``window_end``, ... (fixed windows keep
        the window it leaves)."""
